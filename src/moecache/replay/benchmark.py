"""Replay speed beside libCacheSim's on a paper-scale trace.

Ours replays with per-token semantics (a token's experts arrive together and none of them
may be evicted for another); libCacheSim replays the same demand flattened to single
requests, its native model. Rounds interleave the two so that machine noise hits both;
speed is requests per second at each side's fastest round. The exact optimum (the LP of
moecache.replay.lp) is timed once on all the streams, beside its farthest-future scan.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from moecache.policies import POLICIES, EventPolicy
from moecache.replay import engine, lp, optimum, reference
from moecache.replay.demand import Demand, padded

EVENT_ROUNDS = 3  # rounds for the rules that loop over streams


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


def run(demand: Demand, capacity: int, rounds: int) -> dict:
    requests = int(demand.lengths.sum()) * demand.top_k
    out = {}
    with reference.oracle_trace(demand) as trace:
        for rule, algorithm in reference.ALGORITHMS.items():
            ours, theirs = [], []
            # Rules driven by events step each stream in Python, about 20x slower than the
            # vectorised ones: fewer rounds keep the job short.
            vectorised = not issubclass(POLICIES[rule], EventPolicy)
            compared = reference.runs(rule, capacity)
            for _ in range(rounds if vectorised else min(rounds, EVENT_ROUNDS)):
                # Building the rule counts: farthest future reads the whole stream ahead.
                start = time.perf_counter()
                counts = engine.run(demand, engine.make_rule(rule, demand, capacity))
                ours.append(time.perf_counter() - start)
                if compared:
                    misses, seconds = reference.simulate(trace, capacity, rule)
                    theirs.append(seconds)
            out[rule] = {
                "replay": {
                    "vectorised": vectorised,
                    "rounds": len(ours),
                    "best_seconds": min(ours),
                    "median_seconds": statistics.median(ours),
                    "requests_per_second": requests / min(ours),
                    "insertions": int(counts.insertions.sum()),
                    "after_fill": int(counts.after_fill.sum()),
                },
                "libcachesim": {
                    "algorithm": algorithm,
                    "best_seconds": min(theirs),
                    "median_seconds": statistics.median(theirs),
                    "requests_per_second": requests / min(theirs),
                    "misses": misses,
                }
                if compared
                else {
                    "algorithm": algorithm,
                    "skipped": f"needs capacity >= {reference.MIN_CAPACITY[rule]}",
                },
                "speed_ratio": min(theirs) / min(ours) if compared else None,
            }
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


def lp_speed(demand: Demand, capacity: int) -> dict:
    """Seconds for the LP on every stream; its optimum beside farthest-future's copies
    (equal at unit cost, docs/optimum.md), first loads included."""
    timed = lp.benchmark(demand.requests, demand.num_experts, capacity)
    return {key: value for key, value in timed.items() if key not in ("tokens", "top_k")}
