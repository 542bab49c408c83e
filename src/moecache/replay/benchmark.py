"""Replay speed beside libCacheSim's on a paper-scale trace.

Ours replays with per-token semantics (a token's experts arrive together and none of them
may be evicted for another; LRU, farthest-future and the zoo compiled, policies/kernels.py);
libCacheSim replays the same demand flattened to single requests, its native model. Rounds
interleave the two so that machine noise hits both; speed is requests per second at each
side's median round, and the ratio (libCacheSim's seconds over ours, summed over the
rounds) comes with a bootstrap interval over rounds.
The exact optimum (the LP of moecache.replay.lp) is timed once on all the streams, beside
its farthest-future scan.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from moecache import intervals
from moecache.policies import POLICIES, EventPolicy, EvictionPolicy
from moecache.records.demand import Demand, padded
from moecache.replay import engine, lp, optimum, reference


def paper_scale(settings: dict, seed: int) -> Demand:
    """Bursty demand of `layers` x `sequences` streams; each sequence's length (shared by
    its layers) uniform in [2 * mean - max, max]."""
    rng = np.random.default_rng(seed)
    high = settings["max_tokens"]
    low = max(1, 2 * settings["mean_tokens"] - high)
    lengths = rng.integers(low, high + 1, size=settings["sequences"])
    streams, sequences, tokens = [], [], []
    for layer in range(settings["layers"]):
        demand = optimum.generate(
            rng, "bursty", len(lengths), high, settings["experts"], settings["top_k"]
        )
        for seq, length in enumerate(lengths):
            streams.append(f"layer{layer}/seq{seq}")
            sequences.append(f"seq{seq}")
            tokens.append(demand[seq, :length])
    requests, lengths = padded(tokens, settings["top_k"])
    return Demand(streams, sequences, requests, lengths, settings["experts"])


def run(demand: Demand, capacity: int, rounds: int, seed: int = 0) -> dict:
    """Every rule beside libCacheSim's same algorithm, interleaved: each round times every
    rule, ours then libCacheSim's, so that a slow stretch of the machine hits both. A first
    untimed run compiles the compiled rules (its seconds are reported apart)."""
    requests = int(demand.lengths.sum()) * demand.top_k
    rules = [r for r in engine.lossless_rules(demand) if r in reference.ALGORITHMS] + [
        r for r in engine.lossless_rules(demand) if r not in reference.ALGORITHMS
    ]
    ours, theirs = {rule: [] for rule in rules}, {rule: [] for rule in rules}
    counts, misses = {}, {}
    with reference.oracle_trace(demand) as trace:
        first = {rule: timed(demand, rule, capacity)[1] for rule in rules}
        for _ in range(rounds):
            for rule in rules:
                counts[rule], seconds = timed(demand, rule, capacity)
                ours[rule].append(seconds)
                if rule in reference.ALGORITHMS and reference.runs(rule, capacity):
                    misses[rule], seconds = reference.simulate(trace, capacity, rule)
                    theirs[rule].append(seconds)
    out = {}
    for rule in rules:
        out[rule] = speed(rule, requests, ours[rule], theirs[rule], first[rule], seed)
        out[rule]["replay"]["insertions"] = int(counts[rule].insertions.sum())
        out[rule]["replay"]["after_fill"] = int(counts[rule].after_fill.sum())
        if rule in misses:
            out[rule]["libcachesim"]["misses"] = misses[rule]
    return {
        "streams": len(demand.streams),
        "tokens": int(demand.lengths.sum()),
        "requests": requests,
        "lp": lp_speed(demand, capacity),
        "experts": demand.num_experts,
        "top_k": demand.top_k,
        "capacity": capacity,
        "rounds": rounds,
        "rules": out,
    }


def timed(demand: Demand, rule: str, capacity: int):
    """One replay of every stream, and its seconds; building the rule counts (farthest
    future reads the whole stream ahead)."""
    start = time.perf_counter()
    counts = engine.run(demand, engine.make_rule(rule, demand, capacity))
    return counts, time.perf_counter() - start


def speed(rule: str, requests: int, ours: list, theirs: list, first: float, seed: int) -> dict:
    """Rates at the median round; the ratio is libCacheSim's time over ours summed over
    the rounds, with a 95% bootstrap interval over the rounds (pairs of one round)."""
    policy = POLICIES[rule]
    # A rule with a compiled state replays through the kernel table (given no parameters).
    compiled = policy.compiled_state is not EvictionPolicy.compiled_state
    replay = {
        "engine": "numba" if compiled else "numpy",
        "vectorised": not issubclass(policy, EventPolicy),  # a ranking rule, any engine
        "rounds": len(ours),
        "first_seconds": first,  # the untimed first run, compilation included
        "best_seconds": min(ours),
        "median_seconds": statistics.median(ours),
        "requests_per_second": requests / statistics.median(ours),
    }
    algorithm = reference.ALGORITHMS.get(rule)
    if not theirs:
        skipped = f"needs capacity >= {reference.MIN_CAPACITY[rule]}" if algorithm else "none"
        return {
            "replay": replay,
            "libcachesim": {"algorithm": algorithm, "skipped": skipped},
            "speed_ratio": None,
            "speed_ratio_interval": None,
        }
    return {
        "replay": replay,
        "libcachesim": {
            "algorithm": algorithm,
            "best_seconds": min(theirs),
            "median_seconds": statistics.median(theirs),
            "requests_per_second": requests / statistics.median(theirs),
        },
        "speed_ratio": sum(theirs) / sum(ours),
        "speed_ratio_interval": intervals.bootstrap_ratio(theirs, ours, seed),
    }


def lp_speed(demand: Demand, capacity: int) -> dict:
    """Seconds for the LP on every stream; its optimum beside farthest-future's copies
    (equal at unit cost, docs/optimum.md), first loads included."""
    timed = lp.benchmark(demand.requests, demand.num_experts, capacity)
    return {key: value for key, value in timed.items() if key not in ("tokens", "top_k")}
