"""Greedy farthest-future eviction against the exact optimum on random small instances.

Each instance is a demand stream of one small layer (N experts, C slots, k per token),
uniform, Zipf-distributed or bursty. Per instance: the exact minimum over all lossless
schedules, prefetching included, twice (the LP of moecache.replay.lp and the DP of
moecache.replay.optimum), greedy farthest-future, LRU and the flattened lower bound, all as
the paper's steady traffic B. B_flat <= B* <= B_greedy is a theorem and the LP and the DP
are both exact, so a violation or a disagreement is a bug and fails the sweep; greedy
above B* is a finding and every such instance is reported.
"""

from __future__ import annotations

import itertools

import numpy as np

from moecache.errors import MoecacheError
from moecache.policies import make
from moecache.records.demand import from_arrays
from moecache.replay import bound, engine, optimum


def groups(settings: dict, seed: int):
    """(kind, (N, C, k), T, requests [count, T, k]) batches covering settings['instances']."""
    rng = np.random.default_rng(seed)
    low, high = settings["tokens"]
    cells = list(itertools.product(optimum.KINDS, map(tuple, settings["shapes"])))
    per_cell = -(-settings["instances"] // len(cells))  # ceiling: at least the total asked
    for kind, (experts, capacity, top_k) in cells:
        lengths = rng.integers(low, high + 1, size=per_cell)
        for tokens in np.unique(lengths):
            count = int((lengths == tokens).sum())
            requests = optimum.generate(rng, kind, count, int(tokens), experts, top_k)
            yield kind, (experts, capacity, top_k), int(tokens), requests


def check_group(requests: np.ndarray, experts: int, capacity: int) -> dict[str, np.ndarray]:
    """Every count of every instance of one batch, as steady traffic B."""
    demand = from_arrays(requests, experts)
    lru = make("lru", capacity, experts, demand.top_k, {})
    result = bound.lp_optimum(demand, capacity)
    if not (result.integral and result.certified):
        raise MoecacheError(
            f"sweep: the LP is not integral and certified on N={experts} C={capacity}"
        )
    return {
        "b_flat": bound.flat_bound(demand, capacity)[0],
        "optimum": result.after_fill,
        "dp": bound.dp(demand, capacity),
        "greedy": bound.farthest_future(demand, capacity),
        "lru": engine.run(demand, lru).after_fill,
    }


def run(settings: dict, seed: int) -> dict:
    instances, not_optimal, above_lru = 0, [], 0
    cells: dict[str, dict] = {}
    for kind, (experts, capacity, top_k), tokens, requests in groups(settings, seed):
        counts = check_group(requests, experts, capacity)
        flat, best, greedy, lru = (counts[k] for k in ("b_flat", "optimum", "greedy", "lru"))

        label = f"sweep, {kind} N={experts} C={capacity} k={top_k}"

        def where(i, label=label, requests=requests):
            return f"{label}: instance {requests[i].tolist()}"

        bound.check_sandwich(flat, best, greedy, where)
        bound.check_lp_equals_dp(best, counts["dp"], where)
        cell = cells.setdefault(
            f"{kind} N={experts} C={capacity} k={top_k}",
            {
                "kind": kind,
                "experts": experts,
                "capacity": capacity,
                "top_k": top_k,
                "instances": 0,
                "greedy_optimal": 0,
                "bound_tight": 0,
            },
        )
        cell["instances"] += len(requests)
        cell["greedy_optimal"] += int((greedy == best).sum())
        cell["bound_tight"] += int((flat == best).sum())
        instances += len(requests)
        above_lru += int((greedy > lru).sum())
        for i in np.flatnonzero(greedy > best):
            not_optimal.append(
                {
                    "kind": kind,
                    "experts": experts,
                    "capacity": capacity,
                    "top_k": top_k,
                    "tokens": tokens,
                    "greedy": int(greedy[i]),
                    "optimum": int(best[i]),
                    "b_flat": int(flat[i]),
                    "stream": requests[i].tolist(),
                }
            )
    ratios = sorted({round(c["top_k"] / c["capacity"], 3) for c in cells.values()})
    return {
        "instances": instances,
        "seed": seed,
        "settings": settings,
        "k_over_c": ratios,
        "greedy_not_optimal": len(not_optimal),
        "lp_dp_disagreements": 0,  # checked on every instance; one fails the sweep above
        "greedy_above_lru": above_lru,
        "cells": list(cells.values()),
        "not_optimal_instances": not_optimal,
    }
