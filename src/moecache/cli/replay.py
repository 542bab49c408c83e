"""The replay stage's commands: rules, bounds, the optimum and foresight over recorded
demand; the optimum sweep; the benchmarks; the trace format anyone can write."""

from __future__ import annotations

import argparse
from pathlib import Path

from moecache.cli.command import (
    add,
    emit,
    load_settings,
    on_demand,
    percent,
    read_demand,
    results,
    with_settings,
)
from moecache.errors import MoecacheError
from moecache.records.replay import (
    BoundResult,
    ForesightResult,
    OptimumSweep,
    ReplayResult,
)


def batched(args) -> bool:
    """Whether --batch/--batching ask for union demand (moecache.replay.batch)."""
    return args.batch != 1 or args.batching == "continuous" or getattr(args, "prefill", 0) != 0


def cmd_replay(args):
    if args.tiers:
        return cmd_tiers(args)
    alone = [flag for flag, given in tiers_flags(args) if given]
    if alone:
        raise MoecacheError(f"{alone[0]}: only with --tiers")
    if args.per_request and batched(args):
        raise MoecacheError("--per-request counts one sequence's requests; not with --batch")
    report, source, origin = replayed(args)
    lines = [f"{'rule':34s} {'fills':>7s} {'steady':>8s} {'per token':>9s} {'gap':>7s}"]
    for rule, r in report["rules"].items():
        t = r["totals"]
        rate = "n/a" if t["copies_per_token"] is None else f"{t['copies_per_token']:.2f}"
        lines.append(
            f"{rule:34s} {t['fills']:7d} {t['steady']:8d} {rate:>9s} "
            f"{percent(t['gap_recovered']):>7s}"
            + (f"  prefill {t['prefill_copies']} copies" if "prefill_copies" in t else "")
        )
    emit(args, report, lines, [source], origin, ReplayResult)


def replayed(args) -> tuple[dict, Path, dict | None]:
    """The report of `replay`, its source and origin. Each way imports what it runs alone:
    batch loads every rule (numba), stream tqdm; a small per-request replay needs neither
    (issue 50: a replay command that starts fast)."""
    from moecache.replay import tracefile

    if batched(args):
        from moecache.replay import batch

        demand, source = read_demand(args)
        report = batch.report(
            demand, args.capacity, args.rule, args.batch, args.batching, args.prefill
        )
        return report, source, demand.origin
    if args.trace and tracefile.header(args.trace) is not None:
        from moecache.replay import stream

        # The trace anyone can write may be a production day: streamed, a batch at a time.
        report = stream.report(args.trace, args.capacity, args.rule, per_request=args.per_request)
        return report, args.trace, None
    from moecache.replay import engine, flat

    demand, source = read_demand(args)
    count = flat.report if args.per_request else engine.report
    return count(demand, args.capacity, args.rule), source, demand.origin


def tiers_flags(args):
    """The flags only a tiered replay reads, and whether each was given."""
    return [
        ("--host", args.host is not None),
        ("--host-rule", args.host_rule is not None),
        ("--admission", args.admission is not None),
        ("--optimum", args.optimum),
        ("--optimum-seconds", args.optimum_seconds is not None),
        ("--config", args.config is not None),
        ("--settings", args.settings is not None),
    ]


def host_size(text: str | None) -> int | None:
    """--host: experts per layer in host memory, or inf (every expert: no disk)."""
    if text is None or text == "inf":
        return None
    try:
        return int(text)
    except ValueError:
        raise MoecacheError(f"--host {text}: an expert count or inf") from None


def cmd_tiers(args):
    """replay --tiers: the device pool over a host cache and disk, or over host compute."""
    from moecache.records.tiers import TiersResult
    from moecache.replay import tier_report

    if args.per_request or batched(args):
        raise MoecacheError(
            "--tiers replays one sequence a step, per token: not with "
            "--per-request, --batch, --batching continuous or --prefill"
        )
    seconds = args.optimum_seconds
    if seconds is not None and seconds <= 0:
        raise MoecacheError(f"--optimum-seconds {seconds:g}: must be positive")
    section = None
    if args.config or args.settings:
        section = load_settings(args, ()).get("tiers")  # optional: the defaults without
    host = host_size(args.host)
    demand, source = read_demand(args)
    report = tier_report.report(
        demand,
        args.capacity,
        host,
        args.rule or ["lru", "farthest-future"],
        args.host_rule or "lru",
        list(dict.fromkeys(args.admission or ["always", "bypass"])),
        tier_report.prices(section),
        args.optimum,
        seconds if seconds is not None else OPTIMUM_SECONDS,
    )
    emit(args, report, tiers_lines(report), [source], demand.origin, TiersResult)


OPTIMUM_SECONDS = 10.0  # per stream: the optimum's search stops there with its bound


def tiers_lines(report: dict) -> list[str]:
    p = report["prices"]
    host = "no disk" if report["host"] is None else f"H = {report['host']} ({report['host_rule']})"
    lines = [
        f"C = {report['capacity']} over {host}; ms per copy {p['host_to_device_ms']:g}, "
        f"read {p['disk_to_host_ms']:g}, host compute {p['host_compute_ms']:g}; "
        f"{report['tokens']} tokens",
        f"{'schedule':28s} {'copies':>8s} {'reads':>7s} {'computes':>9s} {'ms/token':>9s}",
    ]
    for name, schedule in report["schedules"].items():
        t = schedule["totals"]
        bound = ""
        if "certified" in t:
            bound = (
                f"  bound {t['bound_ms'] / report['tokens']:.3f}, certified "
                f"{t['certified_streams']}/{report['streams']} streams, {t['seconds']:.1f} s"
            )
        lines.append(
            f"{name:28s} {t['copies']:8d} {t['reads']:7d} {t['computes']:9d} "
            f"{t['ms_per_token']:9.3f}{bound}"
        )
    return lines


def cmd_tiers_grid(args):
    """tiers-grid: the config's grid of tiered replays on each shard's trace (one record)."""
    from moecache import provenance
    from moecache.cli.learned import named_files
    from moecache.records import trace
    from moecache.records.tiers import TiersGrid
    from moecache.replay import tier_grid, tier_report

    settings = load_settings(args, ("tiers",))
    grid = settings["tiers"].get("grid")
    if grid is None:
        raise MoecacheError("tiers-grid: the config has no tiers.grid section")
    traces = named_files(args.trace, "--trace")
    wanted = grid.get("shards", list(traces))
    lacking = [shard for shard in wanted if shard not in traces]
    if lacking:
        raise MoecacheError(f"tiers.grid.shards: no --trace for shard {lacking[0]}")
    shards = {shard: trace.read_demand(traces[shard], None) for shard in wanted}
    report = tier_grid.grid(
        shards,
        grid["capacities"],
        [host_size(str(h)) for h in grid["hosts"]],
        grid["rules"],
        grid["admissions"],
        grid["host_rule"],
        tier_report.prices(settings["tiers"]),
    )
    # Replay runs on the CPU, whatever the harness's device.
    origin = provenance.stamp(settings, "cpu")
    sources = [traces[shard] for shard in wanted]
    emit(args, report, tier_grid.lines(report), sources, origin, TiersGrid)


def cmd_bound(args):
    from moecache.replay import batch, bound, stream, tracefile

    mixed = None
    if args.mixed_share is not None:
        mixed = {"share": args.mixed_share, "cost": args.mixed_cost, "seed": args.seed}
    if batched(args):
        demand, source = read_demand(args)
        demand = batch.fitting(demand, args.batch, args.batching, args.capacity)
        report, origin = bound.report(demand, args.capacity, mixed), demand.origin
    elif args.trace and tracefile.header(args.trace) is not None:  # streamed, as replay
        report = stream.bounds(args.trace, args.capacity, mixed)
        source, origin = args.trace, None
    else:
        demand, source = read_demand(args)
        report = bound.report(demand, args.capacity, mixed)
        origin = demand.origin
    t = report["totals"]
    lines = [
        f"B_flat {t['b_flat']} <= B* {t['b_star']} <= B_greedy {t['b_greedy']} "
        f"(gap {percent(t['gap'])}); greedy optimal on {percent(t['greedy_optimal_share'])} "
        f"of {t['streams']} streams; LP integral {t['integral']}, certified {t['certified']}, "
        f"{t['lp_seconds']:.2f} s; median stream gap {percent(t['median_stream_gap'])}"
    ]
    if mixed:
        m = report["mixed_precision"]["totals"]
        lines.append(
            f"mixed precision ({args.mixed_share:g} of experts at cost {args.mixed_cost:g}): "
            f"LP {m['lp']:g}, farthest-future {m['farthest_future']:g} "
            f"(+{percent(m['farthest_future_gap'])}), cheapest {m['cheapest']:g}"
        )
    emit(args, report, lines, [source], origin, BoundResult)


def cmd_optimum(args):
    from moecache.replay import batch, bound

    demand, source = read_demand(args)
    if batched(args):
        demand = batch.fitting(demand, args.batch, args.batching, args.capacity)
    report = bound.optimum_report(demand, args.capacity)
    lines = [f"{'stream':24s} {'B_flat':>7s} {'optimum':>8s} {'DP':>5s} {'greedy':>7s} integral"]
    for r in report["streams"]:
        by_dp = "-" if r["dp"] is None else str(r["dp"])
        lines.append(
            f"{r['stream']:24s} {r['b_flat']:7d} {r['optimum']:8d} {by_dp:>5s} "
            f"{r['b_greedy']:7d} {r['integral']}"
        )
    emit(args, report, lines, [source], demand.origin)


def cmd_foresight(args):
    from moecache.replay import batch, foresight, stream, tracefile

    if batched(args):
        demand, source = read_demand(args)
        k, held = args.foresight, args.heldout_last
        report = batch.curve(demand, args.capacity, k, held, args.batch, args.batching)
        origin = demand.origin
    elif args.trace and tracefile.header(args.trace) is not None:  # streamed, as replay
        report = stream.foresight(args.trace, args.capacity, args.foresight, args.heldout_last)
        source, origin = args.trace, None
    else:
        demand, source = read_demand(args)
        report = foresight.curve(demand, args.capacity, args.foresight, args.heldout_last)
        origin = demand.origin
    lines = []
    for name, subset in report["subsets"].items():
        points = ", ".join(
            f"{p['k'] or 'unlimited'}: {percent(p['gap_recovered'])}" for p in subset["foresight"]
        )
        causal = ", ".join(f"{r} {percent(s)}" for r, s in subset["causal"].items())
        lines.append(f"{name} ({subset['streams']} streams): foresight {points}; causal {causal}")
    emit(args, report, lines, [source], origin, ForesightResult)


def cmd_optimum_sweep(args):
    from moecache import provenance
    from moecache.replay import sweep

    settings = load_settings(args, ("replay",))
    report = sweep.run(settings["replay"]["optimum"], settings["seed"])
    emit(
        args,
        report,
        [
            f"{report['instances']} instances (k/C {report['k_over_c']}): greedy not optimal on "
            f"{report['greedy_not_optimal']}, above LRU on {report['greedy_above_lru']}; "
            f"the LP equals the DP on all"
        ],
        origin=provenance.stamp(settings, "cpu"),
        kind=OptimumSweep,
    )


def batching(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """--batch/--batching: B sequences decoded at once (docs/batching.md)."""
    p.add_argument("--batch", type=int, default=1, help="sequences decoded at once (B)")
    p.add_argument("--batching", choices=("static", "continuous"), default="static")
    return p


def on_batched_demand(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    return batching(on_demand(p))


def register(sub) -> None:
    register_replay(sub)
    register_bounds(sub)


def register_replay(sub) -> None:
    """`replay` (and its tiers) and the config's tiered grid."""
    p = on_batched_demand(
        add(sub, "replay", cmd_replay, "replay demand under lossless eviction rules")
    )
    p.add_argument(
        "--prefill",
        type=int,
        default=0,
        help="each sequence's first P tokens in one forward, counted apart (docs/batching.md)",
    )
    p.add_argument(
        "--rule",
        action="append",
        help="a rule, with parameters as name:key=value,...; repeat for more (default: all; "
        "with --tiers, the device's: lru and farthest-future)",
    )
    p.add_argument(
        "--per-request",
        action="store_true",
        help="count each token's k experts as k single requests, as one-request-at-a-time "
        "simulators do (not what decoding obeys: docs/replay.md)",
    )
    tiers_arguments(p)
    p = results(
        with_settings(
            add(sub, "tiers-grid", cmd_tiers_grid, "tiered replays over the config's grid")
        )
    )
    p.add_argument("--trace", nargs="+", required=True, help="shard=trace of each shard")


def register_bounds(sub) -> None:
    """The bounds beside the rules: B_flat, B* and greedy, the optimum, foresight's gap."""
    p = on_batched_demand(
        add(sub, "bound", cmd_bound, "B_flat, the exact B* (LP) and greedy B_greedy")
    )
    p.add_argument(
        "--mixed-share",
        type=float,
        help="share of experts at lower precision: adds the LP against greedy at their costs",
    )
    p.add_argument("--mixed-cost", type=float, default=0.5, help="their cost per copy")
    p.add_argument("--seed", type=int, default=0, help="seed of the experts drawn")
    on_batched_demand(
        add(sub, "optimum", cmd_optimum, "the exact fewest copies per stream (the LP)")
    )
    p = on_batched_demand(
        add(sub, "foresight", cmd_foresight, "gap recovered with k tokens of foresight")
    )
    p.add_argument("--foresight", type=int, nargs="+", required=True, help="values of k")
    p.add_argument(
        "--heldout-last", type=int, default=0, help="the last this many sequences are held out"
    )
    results(
        with_settings(
            add(sub, "optimum-sweep", cmd_optimum_sweep, "greedy against the exact optimum")
        )
    )


def tiers_arguments(p: argparse.ArgumentParser) -> None:
    """replay --tiers (docs/tiers.md); --rule then names the device's rules."""
    p.add_argument(
        "--tiers",
        action="store_true",
        help="the pool over a host cache and disk, or over host compute (docs/tiers.md)",
    )
    p.add_argument("--host", help="host experts per layer H, or inf: no disk (default inf)")
    p.add_argument("--host-rule", help="the host's eviction rule (default lru)")
    p.add_argument(
        "--admission",
        action="append",
        choices=("always", "bypass"),
        help="the device's admission; repeat for both (default both)",
    )
    p.add_argument(
        "--optimum", action="store_true", help="add the least cost per admission (HiGHS)"
    )
    p.add_argument(
        "--optimum-seconds",
        type=float,
        help=f"per stream, stop the optimum's search there (default {OPTIMUM_SECONDS:g})",
    )
    with_settings(p)
