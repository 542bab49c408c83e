"""The learned stage's commands: the training trace, the oracle's labels, fitting the
scorers, decoding with them, and their evaluation."""

from __future__ import annotations

from pathlib import Path

from moecache.atomic import atomic_dir
from moecache.cli.command import (
    add,
    emit,
    load_settings,
    on_demand,
    on_model,
    percent,
    provenance_of,
    read_demand,
    results,
    with_settings,
)
from moecache.errors import MoecacheError
from moecache.records.causal import CausalStudy
from moecache.records.io import read_record
from moecache.records.learned import LearnedEvaluation


def cmd_learned_trace(args):
    from moecache.learned import stage

    settings = load_settings(args, ("corpus", "model", "harness"))
    done = stage.record_trace(settings, args.model, args.tokenizer, args.text, args.out)
    print(f"training trace: {done['sequences']} sequences, {done['tokens']} tokens")


def cmd_learned_labels(args):
    from moecache.learned import labels

    demand, source = read_demand(args)
    events = labels.oracle_events(demand, args.capacity)
    labels.write(events, args.out)
    print(f"{source}: {len(events)} evictions of farthest-future labelled")


def cmd_learned_fit(args):
    from moecache.learned import labels, stage
    from moecache.records import trace

    settings = load_settings(args, ("model", "harness", "replay", "learned"))
    demand = trace.read_demand(args.trace, settings["model"]["architecture"]["num_experts"])
    with atomic_dir(args.out_dir) as tmp:
        summaries = stage.fit_group(settings, args.group, demand, labels.read(args.labels), tmp)
    for kind, summary in summaries.items():
        shares = ", ".join(percent(r["validation_gap_recovered"]) for r in summary["rounds"])
        print(
            f"{args.group}/{kind}: validation loss {summary['initial_validation_loss']:.4f} -> "
            f"{summary['validation_loss']:.4f} (step {summary['selected_step']} of "
            f"{summary['steps']}); validation share by round {shares}; "
            f"{summary['seconds']:.1f} s"
        )


def cmd_learned_closed_loop(args):
    from moecache.learned import stage

    settings = load_settings(args, ("model", "harness", "learned"))
    study = None if args.causal is None else read_record(args.causal, CausalStudy)
    runs = stage.closed_loop(
        settings, args.model, args.sequences, args.shard, args.gates, args.out_dir, study
    )
    for label, t in runs.items():
        print(
            f"{label}: {t['fills'] + t['steady_copies']} copies, {t['tokens_per_second']:.1f} tok/s"
        )


def named_files(values: list[str], flag: str) -> dict[str, Path]:
    """shard=path pairs."""
    out = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep:
            raise MoecacheError(f"{flag} {value!r}: give shard=path")
        out[name] = Path(path)
    return out


def files_in(paths: list[Path], pattern: str) -> list[Path]:
    """Each path that is a file, and the files matching `pattern` in each that is a folder."""
    return [f for p in paths for f in (sorted(p.glob(pattern)) if p.is_dir() else [p])]


def cmd_learned_evaluate(args):
    from moecache.learned import stage

    settings = load_settings(args, ("model", "harness", "replay", "learned"))
    traces = named_files(args.trace, "--trace")
    curves = named_files(args.foresight, "--foresight")
    if set(curves) != set(traces):
        raise MoecacheError("--foresight: give one curve for every shard of --trace")
    # Files, or the folders the closed-loop and fit jobs wrote them to.
    closed = files_in(args.closed_loop, "*.json")
    scorers = files_in(args.scorers, "*.safetensors")
    report = stage.evaluate(settings, traces, scorers, curves, closed)
    lines = []
    for shard, result in report["shards"].items():
        for name, row in result["replay"]["heldout"].items():
            everything = result["replay"]["all"][name]["gap_recovered"]
            lines.append(
                f"{shard} {name:28s} held out {percent(row['gap_recovered']):>7s}, "
                f"all {percent(everything):>7s}"
            )
        for name, loop in result["closed_loop"].items():
            lines.append(
                f"{shard} {name:28s} closed loop held out "
                f"{percent(loop['heldout']['gap_recovered'])}, equals replay "
                f"{loop['matches_replay']}, delta NLL {loop['delta_nll']:+.2e}"
            )
    sources = [*traces.values(), *scorers, *curves.values(), *closed]
    emit(args, report, lines, sources, provenance_of(settings), kind=LearnedEvaluation)


def register(sub) -> None:
    p = with_settings(
        add(sub, "learned-trace", cmd_learned_trace, "record the routing of training sequences")
    )
    on_model(p, "--text", "--out")
    p.add_argument("--tokenizer", required=True, help="a tokenizer folder or hub id")
    on_demand(
        add(sub, "learned-labels", cmd_learned_labels, "farthest-future's evictions, as labels")
    )
    p = with_settings(add(sub, "learned-fit", cmd_learned_fit, "train one eviction scorer"))
    p.add_argument("--group", required=True, help="router, trace-past-use or past-use-<shard>")
    for flag in ("--trace", "--labels", "--out-dir"):
        p.add_argument(flag, required=True, type=Path)
    p = with_settings(
        add(sub, "learned-closed-loop", cmd_learned_closed_loop, "decode with learned scorers")
    )
    on_model(p, "--sequences", "--gates", "--out-dir")
    p.add_argument("--shard", required=True)
    p.add_argument("--causal", type=Path, help="the causal study, for learned.causal.closed_loop")
    p = results(
        with_settings(
            add(sub, "learned-evaluate", cmd_learned_evaluate, "scorers' share of the gap")
        )
    )
    p.add_argument("--trace", nargs="+", required=True, help="shard=trace of each shard")
    p.add_argument("--foresight", nargs="+", required=True, help="shard=foresight results")
    p.add_argument(
        "--scorers", nargs="+", required=True, type=Path, help="scorer files or their folders"
    )
    p.add_argument("--closed-loop", nargs="*", default=[], type=Path, help="closed-loop runs")
    register_causal(sub)


def cmd_learned_causal(args):
    from moecache.learned import causal
    from moecache.records import trace

    settings = load_settings(args, ("model", "learned", "seed"))
    if "causal" not in settings["learned"]:
        raise MoecacheError("learned-causal: the config has no learned.causal section")
    experts = settings["model"]["architecture"]["num_experts"]
    traces = named_files(args.trace, "--trace")
    shards = {shard: trace.read_demand(path, experts) for shard, path in traces.items()}
    training = trace.read_demand(args.training, experts)
    with atomic_dir(args.out_dir) as folder:
        study = causal.study(settings, training, shards, folder, args.out_dir)
    lines = []
    for shard, by_c in study.shards.items():
        for c, result in by_c.items():
            for name, row in result["rules"].items():
                low, high = row["interval"]
                lines.append(
                    f"{shard} C={c} {name:20s} {percent(row['share']):>7s} "
                    f"[{percent(low)}, {percent(high)}]"
                )
    sources = [args.training, *traces.values()]
    from moecache import provenance

    # Replay and the logistic fit run on the CPU, whatever the harness's device.
    origin = provenance.stamp(settings, "cpu")
    emit(args, study.as_dict(), lines, sources, origin, kind=CausalStudy)


def register_causal(sub) -> None:
    p = results(
        with_settings(
            add(sub, "learned-causal", cmd_learned_causal, "causal rules, tuned and measured")
        )
    )
    p.add_argument("--training", required=True, type=Path, help="the training trace")
    p.add_argument("--trace", nargs="+", required=True, help="shard=trace of each shard")
    p.add_argument("--out-dir", required=True, type=Path, help="the fitted next-use models")
    p = results(
        with_settings(
            add(
                sub,
                "learned-causal-check",
                cmd_learned_causal_check,
                "causal rules: closed loop against replay, cost per decision",
            )
        )
    )
    p.add_argument("--causal", required=True, type=Path, help="the causal study")
    p.add_argument("--trace", nargs="+", required=True, help="shard=trace of each shard")
    p.add_argument(
        "--closed-loop", nargs="+", required=True, type=Path, help="closed-loop runs or folders"
    )
    p.add_argument("--bandwidth", required=True, type=Path, help="the measured copy time")


def cmd_learned_causal_check(args):
    from moecache import provenance
    from moecache.learned import causal_check
    from moecache.records import trace
    from moecache.records.bandwidth import BandwidthResult
    from moecache.records.causal import CausalCheck
    from moecache.records.io import read_dict, read_run_dict

    settings = load_settings(args, ("model", "harness", "learned", "seed"))
    experts = settings["model"]["architecture"]["num_experts"]
    paths = named_files(args.trace, "--trace")
    traces = {shard: trace.read_demand(path, experts) for shard, path in paths.items()}
    runs = files_in(args.closed_loop, "*.json")
    reports = [read_run_dict(path) for path in runs]
    bandwidth = read_dict(args.bandwidth, BandwidthResult)
    study = read_record(args.causal, CausalStudy)
    found = causal_check.check(settings, study, traces, reports, bandwidth)
    lines = []
    for shard, rules in found["closed_loop"].items():
        for rule, row in rules.items():
            lines.append(
                f"{shard} {rule:20s} closed loop {row['copies']} copies, replay "
                f"{row['replay_copies']}: equal {row['equal']}"
            )
    for rule, row in found["cost"]["rules"].items():
        low, high = row["extra_interval"]
        lines.append(
            f"{rule:20s} {row['ns_per_decision'] / 1e3:6.1f} us a decision, "
            f"{row['extra_ns'] / 1e3:+6.1f} us over LRU [{low / 1e3:+.1f}, {high / 1e3:+.1f}]; "
            f"saves {row['copies_saved_per_decision']:.3f} copies, worth "
            f"{row['worth_ns'] / 1e3:.1f} us at 1x"
        )
    sources = [args.causal, *paths.values(), *runs, args.bandwidth]
    # The timing runs on the CPU, whatever the harness's device.
    emit(args, found, lines, sources, provenance.stamp(settings, "cpu"), kind=CausalCheck)
