"""The replay stage's benchmarks: replay's speed beside libCacheSim's (`benchmark-replay`),
per-request LRU and Belady beside bigrig's and moe-policylang's (`benchmark-per-request`),
and every rule over a generated trace of production size (`benchmark-replay-scale`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from moecache.cli.command import (
    add,
    emit,
    load_settings,
    percent,
    read_demand,
    results,
    with_settings,
)
from moecache.errors import MoecacheError
from moecache.records.replay import (
    ReplayBenchmark,
)
from moecache.records.shape import check_shape


def cmd_benchmark_replay(args):
    from moecache import provenance
    from moecache.replay import benchmark

    settings = load_settings(args, ("replay",))
    bench = settings["replay"]["benchmark"]
    if args.trace:
        demand, sources = read_demand(args)[0], [args.trace]
    else:
        demand, sources = benchmark.paper_scale(bench, settings["seed"]), []
    rounds = args.rounds or bench["rounds"]
    if rounds < 1:
        raise MoecacheError(f"--rounds {rounds}: must be at least 1")
    report = benchmark.run(demand, bench["capacity"], rounds, settings["seed"])
    lines = [
        f"{report['requests']:,} requests in {report['streams']} streams; the LP on all "
        f"streams {report['lp']['lp_seconds']:.2f} s"
    ]
    for rule, r in report["rules"].items():
        theirs = r["libcachesim"]
        versus = (
            f"libCacheSim {theirs['algorithm']} {theirs['requests_per_second'] / 1e6:.2f} M "
            f"req/s (ratio {r['speed_ratio']:.2f}, 95% "
            f"{r['speed_ratio_interval'][0]:.2f}-{r['speed_ratio_interval'][1]:.2f})"
            if r["speed_ratio"] is not None
            else f"libCacheSim {theirs['algorithm']} {theirs['skipped']}"
        )
        lines.append(
            f"{rule}: replay {r['replay']['requests_per_second'] / 1e6:.2f} M req/s, {versus}"
        )
    emit(args, report, lines, sources, provenance.stamp(settings, "cpu"), ReplayBenchmark)


def cmd_benchmark_per_request(args):
    from moecache import provenance
    from moecache.replay import benchmark, peers

    settings = load_settings(args, ("replay",))
    bench = settings["replay"]["benchmark"]
    demand = benchmark.paper_scale(bench, settings["seed"])
    rounds = args.rounds or bench["rounds"]
    if rounds < 1:
        raise MoecacheError(f"--rounds {rounds}: must be at least 1")
    report = peers.run(demand, bench["capacity"], rounds, settings["seed"])
    report["startup"] = startup_of(args, demand, bench["capacity"], rounds, settings["seed"])
    lines = [
        f"{report['requests']:,} requests in {report['streams']} streams, one at a time, "
        f"C = {report['capacity']}, {rounds} interleaved rounds (s per million requests)"
    ]
    for counting, c in report["semantics"].items():
        lines.append(
            f"{counting.replace('_', ' ')}: LRU {c['lru']:,}, farthest-future "
            f"{c['farthest_future']:,} insertions (saving {percent(c['saving'])})"
        )
    for rule, r in report["rules"].items():
        versus = ", ".join(
            f"{tool} {t['seconds_per_million_requests']:.3f} ({t['speedup']:.1f}x slower, 95% "
            f"{t['speedup_interval'][0]:.1f}-{t['speedup_interval'][1]:.1f})"
            for tool, t in r.items()
            if isinstance(t, dict) and "speedup" in t
        )
        ours = r["moecache"]["seconds_per_million_requests"]
        lines.append(f"{rule} ({r['misses']:,} misses, all equal): moecache {ours:.3f}; {versus}")
    lines.append(startup_line(report["startup"]))
    sources = [args.trace] if args.trace else []
    emit(args, report, lines, sources, provenance.stamp(settings, "cpu"))


def startup_of(args, demand, capacity: int, rounds: int, seed: int) -> dict:
    """`moecache replay --per-request --rule lru` end to end beside the ten-line bigrig
    script (moecache.replay.startup), on --trace or on `demand` written as a harness trace."""
    import tempfile

    from moecache.replay import startup

    if args.trace:
        experts = read_demand(args)[0].num_experts
        return startup.run(args.trace, capacity, experts, rounds, seed)
    with tempfile.TemporaryDirectory() as folder:
        trace = startup.write_trace(demand, Path(folder) / "paper-scale.parquet")
        timed = startup.run(trace, capacity, demand.num_experts, rounds, seed)
        return {**timed, "trace": "replay.benchmark's demand, written as a harness trace"}


def startup_line(s: dict) -> str:
    low, high = s["ratio_interval"]
    verdict = "within" if s["within_target"] else "above"
    return (
        f"start-up, end to end ({s['misses']:,} LRU misses, equal): moecache replay "
        f"{s['moecache']['median_seconds']:.2f} s, bigrig script "
        f"{s['bigrig']['median_seconds']:.2f} s (ratio {s['ratio']:.2f}, 95% {low:.2f}-"
        f"{high:.2f}; {verdict} the target {s['target']:g})"
    )


def cmd_benchmark_replay_scale(args):
    from moecache import provenance
    from moecache.replay import scale

    shape = {
        "sequences": args.sequences,
        "tokens": args.tokens,
        "layers": args.layers,
        "experts": args.experts,
        "top_k": args.top_k,
    }
    for name, value in shape.items():
        if value < 1:
            raise MoecacheError(f"--{name.replace('_', '-')} {value}: must be at least 1")
    check_shape(
        shape["top_k"], args.capacity, shape["experts"], where=f"--capacity {args.capacity}"
    )
    report = scale.run(shape, args.capacity, args.seed, args.tmp)
    lines = [
        f"{report['requests']:,} requests ({report['streams']:,} streams), peak memory "
        f"{report['peak_memory_gib']:.2f} GiB; read alone {report['read_seconds']:.1f} s"
    ]
    for rule, r in report["rules"].items():
        lines.append(f"{rule}: {r['seconds']:.1f} s, {r['requests_per_second'] / 1e6:.2f} M req/s")
    emit(args, report, lines, origin=provenance.stamp({"replay_scale": shape}, "cpu"))


def register(sub) -> None:
    p = results(
        with_settings(
            add(sub, "benchmark-replay", cmd_benchmark_replay, "replay speed beside libCacheSim's")
        )
    )
    p.add_argument("--trace", type=Path, help="time this harness trace instead")
    p.add_argument("--experts", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, help="timed rounds (default: the config's)")
    p = results(
        with_settings(
            add(
                sub,
                "benchmark-per-request",
                cmd_benchmark_per_request,
                "per-request LRU and Belady beside bigrig's and moe-policylang's",
            )
        )
    )
    p.add_argument("--rounds", type=int, help="interleaved rounds (default: the config's)")
    p.add_argument(
        "--trace",
        type=Path,
        help="a shard's harness trace to time start-up on (default: the benchmark's demand)",
    )
    p.add_argument("--experts", type=int, help=argparse.SUPPRESS)
    register_scale(sub)


def register_scale(sub) -> None:
    p = results(
        add(
            sub,
            "benchmark-replay-scale",
            cmd_benchmark_replay_scale,
            "every rule over a generated trace of production size, streamed: seconds, memory",
        )
    )
    for flag, default, what in (
        ("--sequences", 400, "sequences"),
        ("--tokens", 1000, "tokens per sequence"),
        ("--layers", 32, "MoE layers"),
        ("--experts", 64, "experts per layer (N)"),
        ("--top-k", 8, "experts per token (k)"),
        ("--capacity", 32, "pool slots (C)"),
        ("--seed", 0, "seed of the generated demand"),
    ):
        p.add_argument(flag, type=int, default=default, help=f"{what} (default {default})")
    p.add_argument("--tmp", type=Path, help="folder for the generated trace (default: $TMPDIR)")
