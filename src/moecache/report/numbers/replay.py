"""The replay section: trace replay per shard and capacity, the bounds, the mixed-precision
costs, foresight, the optimum sweep and the replay benchmark."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from moecache.errors import MoecacheError
from moecache.records.io import read_dict, read_replay_dict
from moecache.records.replay import BoundResult, ForesightResult, OptimumSweep, ReplayBenchmark
from moecache.report import replayed
from moecache.report.numbers.format import count, fixed, percent, sig, table, yes


def replay_section(workdir: Path, shards: Sequence[str]) -> str:
    """Trace replay per shard and capacity: each rule's share of the gap and steady copies;
    the bounds; the mixed-precision costs; foresight; the sweep; the replay benchmark."""
    found = replayed.found(workdir, "replay", shards)
    if not found:
        raise MoecacheError(f"{workdir / 'results/replay'}: no replay results (run the pipeline)")
    # (shard, C) -> that replay; bounds and foresight beside it in the same folder.
    replays = {(s, c): read_replay_dict(path) for s, c, path in found}
    bounds = {(s, c): read_dict(path.with_name("bound.json"), BoundResult) for s, c, path in found}
    first = next(iter(replays.values()))
    capacities = sorted({c for _, c in replays})
    parts = [
        f"Trace of run `{first.get('run', 'n/a')}` at {first.get('multiplier', 1)}x; "
        f"C = {' and '.join(map(str, capacities))} of {first['experts']} experts; streams: "
        + ", ".join(
            f"shard {s} {replays[s, c]['streams']}" for s, c in replays if c == first["capacity"]
        )
        + "."
    ]
    parts.append(rules_table(replays))
    flattened = {
        (s, c): read_replay_dict(path.with_name("per-request.json"))
        for s, c, path in found
        if path.with_name("per-request.json").exists()
    }
    if flattened:
        parts.append(per_request_table(replays, flattened))
    parts.append(bounds_table(bounds))
    every = all(b["totals"]["greedy_optimal"] for b in bounds.values())
    parts.append(
        "Greedy farthest-future equals B* on every stream of every shard and capacity: "
        f"{yes(every)}."
    )
    mixed = {key: b.get("mixed_precision") for key, b in bounds.items()}
    if all(mixed.values()):
        parts.append(mixed_table(mixed))
    foresight = {}
    for s, c, path in found:
        if (curve := path.with_name("foresight.json")).exists():
            foresight[s, c] = read_dict(curve, ForesightResult)
    if foresight:
        parts.append(foresight_table(foresight))

    sweep_file = workdir / "results/replay/optimum-sweep.json"
    if sweep_file.exists():
        w = read_dict(sweep_file, OptimumSweep)
        parts.append(
            f"Optimum sweep: {count(w['instances'])} instances (k/C "
            f"{', '.join(f'{x:g}' for x in w['k_over_c'])}); greedy not optimal on "
            f"{count(w['greedy_not_optimal'])}, above LRU on {count(w['greedy_above_lru'])}; "
            f"LP and DP disagree on {count(w['lp_dp_disagreements'])}."
        )
    bench_file = workdir / "results/replay/benchmark.json"
    if bench_file.exists():
        parts.append(benchmark_table(read_dict(bench_file, ReplayBenchmark)))
    return "\n\n".join(parts)


def at(key: tuple[str, int]) -> str:
    return f"shard {key[0]}, C = {key[1]}"


def rules_table(replays: dict) -> str:
    rules = list(dict.fromkeys(rule for r in replays.values() for rule in r["rules"]))
    rows = []
    for rule in rules:
        cells = [rule]
        for r in replays.values():
            totals = r["rules"].get(rule, {}).get("totals")
            cells += (
                [percent(totals["gap_recovered"]), count(totals["steady"])]
                if totals
                else ["n/a", "n/a"]
            )
        rows.append(cells)
    header = ["rule"]
    for key in replays:
        header += [f"{at(key)}: share of the LRU-to-oracle gap", f"{at(key)}: steady copies"]
    return table(header, rows)


def per_request_table(replays: dict, flattened: dict) -> str:
    """LRU and farthest-future copies (first loads included) counted per token, as decoding
    obeys, and per request, as one-request-at-a-time simulators count (docs/replay.md)."""
    rows = []
    for key, flat in flattened.items():
        token, request = replays[key]["rules"], flat["rules"]
        lru, far = (token[r]["totals"]["insertions"] for r in ("lru", "farthest-future"))
        lru_1, far_1 = (request[r]["totals"]["insertions"] for r in ("lru", "farthest-future"))
        rows.append(
            (
                at(key),
                count(lru),
                count(lru_1),
                count(far),
                count(far_1),
                percent(1 - far / lru),
                percent(1 - far_1 / lru_1),
            )
        )
    return "\n\n".join(
        [
            "Per token (a token's experts resident together, as decoding needs) against per "
            "request (each token's k experts as k single requests, `moecache replay "
            "--per-request`, as libCacheSim, bigrig and moe-policylang count): copies, first "
            "loads included, and farthest-future's saving over LRU.",
            table(
                (
                    "shard, C",
                    "LRU per token",
                    "LRU per request",
                    "farthest-future per token (B*)",
                    "Belady per request",
                    "saving per token",
                    "saving per request",
                ),
                rows,
            ),
        ]
    )


def bounds_table(bounds: dict) -> str:
    rows = []
    for (s, c), b in bounds.items():
        t = b["totals"]
        rows.append(
            (
                s,
                str(c),
                count(t["streams"]),
                count(t["b_flat"]),
                count(t["b_star"]),
                count(t["b_greedy"]),
                yes(t["greedy_optimal"]),
                percent(t["gap"]),
                percent(t["coincide_share"]),
                f"{yes(t['integral'])} / {yes(t['certified'])}",
                fixed(t["lp_seconds"], 2),
            )
        )
    header = (
        "shard",
        "C",
        "streams",
        "B_flat",
        "B* (LP)",
        "B_greedy",
        "greedy = B* on every stream",
        "B_flat's gap",
        "streams where B_flat = B_greedy",
        "LP integral / certified",
        "LP seconds",
    )
    return table(header, rows)


def mixed_table(mixed: dict) -> str:
    rows = []
    for (s, c), m in mixed.items():
        t = m["totals"]
        rows.append(
            (
                s,
                str(c),
                f"{fixed(m['share'], 2)} at cost {m['cost']:g}",
                f"{t['lp']:,g}",
                f"{t['farthest_future']:,g} (+{percent(t['farthest_future_gap'])})",
                f"{t['cheapest']:,g} (+{percent(t['cheapest_gap'])})",
                percent(t["farthest_future_optimal_share"]),
            )
        )
    header = (
        "mixed precision, shard",
        "C",
        "cheaper experts",
        "LP reload cost",
        "farthest future",
        "cheapest first",
        "streams where farthest future is optimal",
    )
    return table(header, rows)


def foresight_table(foresight: dict[tuple[str, int], dict]) -> str:
    """Gap share per foresight k, held-out sequences and all, per shard and capacity; the
    best causal rule of each subset last."""
    columns = [(s, name) for s, r in foresight.items() for name in r["subsets"]]
    ks = list(
        dict.fromkeys(
            p["k"]
            for r in foresight.values()
            for sub in r["subsets"].values()
            for p in sub["foresight"]
        )
    )
    ks.sort(key=lambda k: math.inf if k is None else k)
    rows = []
    for k in ks:
        cells = ["unlimited" if k is None else str(k)]
        for s, name in columns:
            points = {
                p["k"]: p["gap_recovered"] for p in foresight[s]["subsets"][name]["foresight"]
            }
            cells.append(percent(points.get(k)) if k in points else "n/a")
        rows.append(cells)
    best = ["best causal rule"]
    for s, name in columns:
        causal = foresight[s]["subsets"][name]["causal"]
        rule = max(sorted(causal), key=lambda r: -math.inf if causal[r] is None else causal[r])
        best.append(f"{rule} {percent(causal[rule])}")
    rows.append(best)
    header = ["foresight k"] + [
        f"{at(s)}, {name} ({foresight[s]['subsets'][name]['streams']} streams)"
        for s, name in columns
    ]
    return table(header, rows)


def benchmark_table(b: dict) -> str:
    rows = []
    for rule, r in b["rules"].items():
        theirs = r["libcachesim"]
        libcachesim = (
            f"{sig(theirs['requests_per_second'] / 1e6)} ({theirs['algorithm']})"
            if "requests_per_second" in theirs
            else f"{theirs['algorithm']}: {theirs.get('skipped', 'n/a')}"
        )
        ratio = r["speed_ratio"]
        low, high = r.get("speed_ratio_interval") or (None, None)
        rows.append(
            (
                rule,
                sig(r["replay"]["requests_per_second"] / 1e6),
                libcachesim,
                "n/a" if ratio is None else fixed(ratio, 2),
                "n/a" if low is None else f"{fixed(low, 2)} to {fixed(high, 2)}",
            )
        )
    lp = b["lp"]
    return "\n\n".join(
        [
            f"Replay speed: {count(b['requests'])} requests in {count(b['streams'])} streams, "
            f"C = {b['capacity']} of {b['experts']}; {b['rounds']} interleaved rounds, rates "
            f"at the median round; ratio: libCacheSim's seconds over ours, summed over the "
            f"rounds, with its 95% bootstrap interval over rounds.",
            table(
                (
                    "rule",
                    "replay (M requests/s)",
                    "libCacheSim (M requests/s)",
                    "ratio",
                    "95% interval",
                ),
                rows,
            ),
            f"The LP on all {count(lp['streams'])} streams: {fixed(lp['lp_seconds'], 2)} s, "
            f"{count(lp['variables'])} variables, optimum {lp['optimum']:,g} copies "
            f"(farthest future {lp['farthest_future']:,g}); integral {yes(lp['integral'])}, "
            f"certified {yes(lp['certified'])}.",
        ]
    )
