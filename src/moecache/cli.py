"""The `moecache` command line: each pipeline stage is one subcommand; rules only call these.

Settings come either from a whole config file (`--config FILE`, validated in full) or, as
the Snakemake rules pass them, as JSON holding just the sections a stage reads
(`--settings JSON`), so a rule reruns only when its own sections change.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from moecache import config as configs
from moecache.errors import MoecacheError


def load_settings(args: argparse.Namespace, sections: tuple[str, ...]) -> dict:
    if args.config:
        settings = configs.load(args.config)
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


def cmd_validate_config(args):
    configs.load(args.file)
    print(f"{args.file}: valid")


def cmd_corpus(args):
    from moecache import corpus

    settings = load_settings(args, ("corpus",))
    corpus.write(corpus.build(settings["corpus"], settings["seed"]), args.out_dir)


def cmd_tokenizer(args):
    from moecache import corpus, tokenizer

    settings = load_settings(args, ("tokenizer",))
    texts = [doc["text"] for doc in corpus.read(args.train)]
    tokenizer.train(texts, settings["tokenizer"]["vocab_size"], args.out)


def cmd_heldout(args):
    from moecache import corpus, tokenizer

    settings = load_settings(args, ("corpus",))
    tok = tokenizer.load(args.tokenizer)
    max_tokens = settings["corpus"]["heldout"]["max_tokens"]
    rows = corpus.sequences(tok, corpus.read(args.text), max_tokens)
    corpus.write_sequences(rows, args.out)


def cmd_train(args):
    from moecache import corpus, train

    settings = load_settings(args, ("model", "training"))
    texts = [doc["text"] for doc in corpus.read(args.train)]
    summary = train.train(settings, args.tokenizer, texts, args.out)
    last = summary["log"][-1]
    print(
        f"trained {summary['parameters']:,} parameters on {summary['tokens_seen']:,} tokens; "
        f"final lm loss {last['lm_loss']:.3f}"
    )


def cmd_profile_model(args):
    from moecache import harness

    settings = load_settings(args, ("model", "harness"))
    report = harness.run_profile(settings, args.model, args.sequences, args.out)
    print(json.dumps({k: v for k, v in report.items() if not k.endswith("per_layer")}))


def cmd_gates(args):
    from moecache import harness

    settings = load_settings(args, ("model", "harness"))
    report = harness.run_gates(settings, args.model, args.sequences, args.out)
    print(
        f"gates passed: base NLL {report['base']['nll']:.6f}, batched "
        f"{report['batched_nll']:.6f}; pool/own-block throughput "
        f"{report['throughput_ratio_pool_vs_own_block']:.3f}"
    )


def cmd_decode(args):
    from moecache import harness

    settings = load_settings(args, ("model", "harness"))
    report = harness.run_decode(
        settings,
        args.model,
        args.sequences,
        args.run,
        args.multiplier,
        args.gates,
        args.out,
        args.trace_out,
        args.trace_in,
    )
    t = report["totals"]
    print(
        f"{args.run} x{args.multiplier}: NLL {t['nll']:.4f} (delta {t['delta_nll']:+.4f}), "
        f"{t['tokens_per_second']:.1f} tok/s, rho {t['rho']:.2f}"
    )


def cmd_probe_layers(args):
    from moecache import harness

    settings = load_settings(args, ("model", "harness"))
    report = harness.run_probe(settings, args.model, args.sequences, args.gates, args.out)
    for row in report["layers"]:
        print(f"layer {row['layer']}: delta NLL {row['delta_nll']:+.4f}")


def cmd_bandwidth(args):
    from moecache import harness

    settings = load_settings(args, ("model", "harness"))
    r = harness.run_bandwidth(settings, args.model, args.out)
    print(
        f"tau {r['tau_ms']:.4f} ms per expert, loop {r['loop_gib_per_s']:.1f} GiB/s, "
        f"one large copy {r['large_gib_per_s']:.1f} GiB/s"
    )


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="moecache", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)

    def command(name, func, help):
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

    p = command("validate-config", cmd_validate_config, "check a config file against the schema")
    p.add_argument("file")

    p = with_settings(command("corpus", cmd_corpus, "build the training text and held-out shards"))
    p.add_argument("--out-dir", required=True, type=Path)

    p = with_settings(command("tokenizer", cmd_tokenizer, "train the byte-level BPE tokenizer"))
    p.add_argument("--train", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)

    p = with_settings(command("heldout", cmd_heldout, "tokenize one held-out shard"))
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--text", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)

    p = with_settings(command("train", cmd_train, "train the embedded tiny OLMoE"))
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--train", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)

    p = with_settings(
        command(
            "profile-model",
            cmd_profile_model,
            "time one expert copy and one token, measure routing reuse",
        )
    )
    on_model(p, "--sequences", "--out")
    p = with_settings(command("gates", cmd_gates, "exactness gates on one shard"))
    on_model(p, "--sequences", "--out")

    p = with_settings(command("decode", cmd_decode, "decode one shard under one run's policy"))
    on_model(p, "--sequences")
    p.add_argument("--run", required=True, help="a run name of harness.runs")
    p.add_argument("--multiplier", type=int, default=1, help="repeat every copy m times")
    p.add_argument("--gates", required=True, type=Path, help="the shard's gates file")
    p.add_argument("--trace-in", type=Path, help="recorded demand, for farthest-future")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--trace-out", required=True, type=Path)

    p = with_settings(
        command(
            "probe-layers", cmd_probe_layers, "restrict one layer at a time; delta NLL per layer"
        )
    )
    on_model(p, "--sequences", "--gates", "--out")

    p = with_settings(command("bandwidth", cmd_bandwidth, "copy time and bandwidth per expert"))
    on_model(p, "--out")
    return top


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        args.func(args)
    except MoecacheError as error:
        print(f"moecache: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
