"""Replay speed beside libCacheSim's on a paper-scale trace.

Ours replays with per-token semantics (a token's experts arrive together and none of them
may be evicted for another); libCacheSim replays the same demand flattened to single
requests, its native model. Rounds interleave the two so that machine noise hits both;
speed is requests per second at each side's fastest round.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from moecache import libcachesim_ref, optimum, replay
from moecache.demand import Demand, padded


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
    with libcachesim_ref.oracle_trace(demand) as trace:
        for rule, algorithm in libcachesim_ref.ALGORITHMS.items():
            ours, theirs = [], []
            for _ in range(rounds):
                # Building the rule counts: farthest future reads the whole stream ahead.
                start = time.perf_counter()
                counts = replay.run(demand, replay.make_rule(rule, demand, capacity))
                ours.append(time.perf_counter() - start)
                misses, seconds = libcachesim_ref.simulate(trace, capacity, rule)
                theirs.append(seconds)
            out[rule] = {
                "replay": {
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
                },
                "speed_ratio": min(theirs) / min(ours),
            }
    return {
        "streams": len(demand.streams),
        "tokens": int(demand.lengths.sum()),
        "requests": requests,
        "experts": demand.num_experts,
        "top_k": demand.top_k,
        "capacity": capacity,
        "rounds": rounds,
        "rules": out,
    }
