"""Per-request replay's speed beside the two one-request-at-a-time simulators it is checked
against (tests/test_per_request.py): bigrig 0.9.1 (bigrig_engine.pool: `simulate` with its
LRU, `belady`) and moe-policylang 1.15.0 (moe_policylang.benchmark.replay:
`policy_topk_lru`, `policy_belady`, fed a row per request with top_k = 1). Each tool
replays every stream of the same paper-scale demand, flattened to single requests; rounds
interleave the three tools rule by rule, so a slow stretch of the machine hits all of
them. Each tool's misses must equal ours (or the run stops): the same counts, timed.
Ratios are a peer's seconds over ours summed over the rounds, with a bootstrap interval
over rounds.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from moecache import intervals
from moecache.errors import MoecacheError
from moecache.records.demand import Demand
from moecache.replay import engine, flat


def peer_modules():
    """bigrig's pool and moe-policylang's replay, or one line saying how to get them."""
    try:
        from bigrig_engine import pool
        from moe_policylang.benchmark import replay
    except ImportError as error:
        raise MoecacheError(
            f"benchmark-per-request needs the pinned peers ({error.name} missing): "
            "pip install -r envs/requirements-dev.txt -c envs/constraints.txt"
        ) from None
    return pool, replay


def streams_of(demand: Demand) -> list[np.ndarray]:
    """Each stream's requests one at a time, in the router's order."""
    return [demand.requests[s, :n].reshape(-1) for s, n in enumerate(demand.lengths)]


def one_hot(requests: np.ndarray, experts: int) -> np.ndarray:
    """moe-policylang's input for single requests: a softmax row per request whose only
    score is the requested expert's."""
    rows = np.zeros((len(requests), experts), dtype=np.float32)
    rows[np.arange(len(requests)), requests] = 1
    return rows


def runners(demand: Demand, capacity: int) -> dict[str, dict[str, object]]:
    """rule -> tool -> a function replaying every stream and returning its misses."""
    pool, replay = peer_modules()
    experts, lists = demand.num_experts, [s.tolist() for s in streams_of(demand)]
    rows = [one_hot(s, experts) for s in streams_of(demand)]

    def ours(rule):
        return lambda: int(flat.replayed(demand, rule, capacity).insertions.sum())

    def policylang(function):
        return lambda: sum(len(r) - function(r, 1, capacity)[0] for r in rows)

    return {
        "lru": {
            "moecache": ours("lru"),
            "bigrig": lambda: sum(
                pool.simulate(s, capacity, experts, pool.LRU)["misses"] for s in lists
            ),
            "moe-policylang": policylang(replay.policy_topk_lru),
        },
        "farthest-future": {
            "moecache": ours("farthest-future"),
            "bigrig": lambda: sum(pool.belady(s, capacity)["misses"] for s in lists),
            "moe-policylang": policylang(replay.policy_belady),
        },
    }


def run(demand: Demand, capacity: int, rounds: int, seed: int = 0) -> dict:
    """Every tool on every rule, interleaved for `rounds` rounds after an untimed first
    (compilation); the counts must agree."""
    demand.check_capacity(capacity)
    requests = int(demand.lengths.sum()) * demand.top_k
    tools = runners(demand, capacity)
    counts = {rule: {tool: f() for tool, f in by.items()} for rule, by in tools.items()}
    for rule, by in counts.items():
        if len(set(by.values())) > 1:
            raise MoecacheError(f"{rule}: the tools disagree on the misses: {by}")
    seconds = {rule: {tool: [] for tool in by} for rule, by in tools.items()}
    for _ in range(rounds):
        for rule, by in tools.items():
            for tool, replay in by.items():
                start = time.perf_counter()
                replay()
                seconds[rule][tool].append(time.perf_counter() - start)
    out = {}
    for rule, by in seconds.items():
        ours = by["moecache"]
        out[rule] = {"misses": counts[rule]["moecache"]}
        for tool, timed in by.items():
            entry = {
                "median_seconds": statistics.median(timed),
                "best_seconds": min(timed),
                "seconds_per_million_requests": statistics.median(timed) / requests * 1e6,
            }
            if tool != "moecache":
                entry["speedup"] = sum(timed) / sum(ours)  # their seconds over ours
                entry["speedup_interval"] = intervals.bootstrap_ratio(timed, ours, seed)
            out[rule][tool] = entry
    return {
        "semantics": semantics(demand, capacity),
        "streams": len(demand.streams),
        "tokens": int(demand.lengths.sum()),
        "requests": requests,
        "experts": demand.num_experts,
        "top_k": demand.top_k,
        "capacity": capacity,
        "rounds": rounds,
        "counting": "per-request",
        "rules": out,
    }


def semantics(demand: Demand, capacity: int) -> dict:
    """Insertions (first loads included) of LRU and farthest-future counted per token, as
    decoding obeys, and per request, with farthest-future's saving over LRU under each;
    per token, farthest-future is the exact optimum (docs/optimum.md)."""
    out = {}
    for counting, replay in (("per_token", engine.replayed), ("per_request", flat.replayed)):
        lru, far = (
            int(replay(demand, r, capacity).insertions.sum()) for r in ("lru", "farthest-future")
        )
        out[counting] = {"lru": lru, "farthest_future": far, "saving": 1 - far / lru}
    return out
