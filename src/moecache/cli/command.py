"""What the stages' commands share: settings, the report they emit, demand to replay, and
the flags many of them take. Each stage's `commands.py` declares its own subcommands."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from moecache.errors import MoecacheError


def load_settings(args: argparse.Namespace, sections: tuple[str, ...]) -> dict:
    from moecache import config as configs  # jsonschema and yaml: 0.15 s a replay never needs

    if args.config:
        settings = configs.load(args.config)
        missing = [section for section in sections if section not in settings]
        if missing:  # a trace study's config has no model, corpus or harness
            kind = " (a trace study's)" if "trace" in settings else ""
            needs = "a model" if missing[0] == "model" else f"its {missing[0]} section"
            raise MoecacheError(
                f"{args.config}: no {missing[0]} section{kind}: this command needs {needs}"
            )
    elif args.settings:
        try:
            settings = json.loads(args.settings)
        except json.JSONDecodeError as error:
            raise MoecacheError(f"--settings: not valid JSON ({error})") from None
        configs.validate_schema(settings, required=("seed", "hub_offline", *sections))
    else:
        raise MoecacheError("give --config FILE or --settings JSON")
    if settings["hub_offline"]:
        # Read by huggingface_hub, datasets and transformers when they are first imported.
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
            os.environ[name] = "1"
    return settings


def emit(args, report: dict, summary: list[str], sources=(), origin=None, kind=None) -> None:
    """The report as JSON (--json on stdout, --out to a file) or as summary lines.
    `origin`: the config hash and device the numbers trace back to (a trace's run, or the
    settings and machine of a sweep or benchmark). `kind`: the record its file holds
    (records/replay.py), written through records/io with its schema version."""
    from moecache import provenance
    from moecache.records.io import write_record

    if kind is None:
        provenance.write_results(args.out, report, origin=origin, inputs=sources)
    else:
        stamped = provenance.write_results(None, report, origin=origin, inputs=sources)
        report = write_record(args.out, kind(**stamped))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print("\n".join(summary))


def percent(share) -> str:
    return "n/a" if share is None else f"{100 * share:.1f}%"


def provenance_of(settings):
    from moecache import provenance

    return provenance.stamp(settings, settings["harness"]["device"])


def read_demand(args):
    from moecache.records import demand, trace
    from moecache.replay import tracefile

    if args.trace:
        if tracefile.header(args.trace) is not None:  # the versioned trace anyone can write
            return tracefile.read_demand(args.trace), args.trace
        return trace.read_demand(args.trace, args.experts), args.trace
    if args.experts is None:
        raise MoecacheError("--demand: give --experts N, the layer's expert count")
    return demand.read_jsonl(args.demand, args.experts), args.demand


def add(sub, name: str, func, help: str) -> argparse.ArgumentParser:
    """A subcommand of `sub` that runs `func(args)`."""
    p = sub.add_parser(name, help=help)
    p.set_defaults(func=func)
    return p


def with_settings(p):
    group = p.add_mutually_exclusive_group()
    group.add_argument("--config", help="a whole config file (YAML)")
    group.add_argument("--settings", help="JSON with the sections this stage reads")
    return p


def on_model(p, *flags):
    """The model and held-out sequences a harness stage reads, plus its own flags."""
    p.add_argument("--model", required=True, help="a model folder or hub id")
    for flag in flags:
        p.add_argument(flag, required=True, type=Path)
    return p


def results(p):
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--out", type=Path, help="write the report as JSON to this file")
    return p


def on_demand(p, capacity=True):
    """Demand from a harness trace or a JSON-lines file, and the pool size."""
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--trace",
        type=Path,
        help="a trace: moecache-trace (docs/trace-format.md) or a harness one",
    )
    source.add_argument(
        "--demand", type=Path, help='JSON lines: {"stream": id, "tokens": [[e, ...], ...]}'
    )
    p.add_argument("--experts", type=int, help="experts per layer (N; needed with --demand)")
    if capacity:
        p.add_argument("--capacity", type=int, required=True, help="pool slots (C)")
    return results(p)
