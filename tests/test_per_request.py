"""Per-request counting (`moecache replay --per-request`) equals what the one-request-at-
a-time simulators count, LRU and Belady, on generated traces: bigrig 0.9.1's pool
simulator and moe-policylang 1.15.0's trace replay (pinned test dependencies,
envs/requirements-dev.txt); per-token counting, the engine's, stays at or above the exact
optimum where per-request Belady goes below it. The compiled LRU and farthest-future (the
kernel table, moecache.policies.kernels) count what the vectorised rules count."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moecache.records.demand import Demand, from_arrays, padded
from moecache.replay import bound, engine, flat, optimum


def generated(seed: int, kind: str, streams=4, tokens=120, experts=16, k=4) -> Demand:
    rng = np.random.default_rng(seed)
    requests = optimum.generate(rng, kind, streams, tokens, experts, k)
    for row in requests:  # the router's order, not sorted ids
        for token in row:
            rng.shuffle(token)
    return from_arrays(requests, experts)


def per_request(demand: Demand, rule: str, capacity: int) -> np.ndarray:
    return flat.replayed(demand, rule, capacity).insertions


CASES = [(seed, kind, c) for seed, kind in enumerate(("bursty", "zipf", "uniform")) for c in (4, 8)]


@pytest.mark.parametrize(("seed", "kind", "capacity"), CASES)
def test_bigrig_counts_what_per_request_counts(seed, kind, capacity):
    pool = pytest.importorskip("bigrig_engine.pool")
    demand = generated(seed, kind)
    lru, belady = (
        per_request(demand, "lru", capacity),
        per_request(demand, "farthest-future", capacity),
    )
    for s, stream in enumerate(demand.requests):
        requests = stream.reshape(-1).tolist()
        simulated = pool.simulate(requests, capacity, demand.num_experts, pool.LRU)
        assert simulated["misses"] == lru[s]
        assert pool.belady(requests, capacity)["misses"] == belady[s]


@pytest.mark.parametrize(("seed", "kind", "capacity"), CASES)
def test_policylang_counts_what_per_request_counts(seed, kind, capacity):
    """moe-policylang replays a layer's router softmax [T, N] with top_k; fed one request
    at a time (a row per request, its expert the row's only score, top_k = 1) its LRU and
    Belady count what per-request counting does. (With top_k > 1 its Belady reads next
    uses a token at a time and is no longer MIN.)"""
    replay = pytest.importorskip("moe_policylang.benchmark.replay")
    demand = generated(seed, kind)
    lru = per_request(demand, "lru", capacity)
    belady = per_request(demand, "farthest-future", capacity)
    for s, stream in enumerate(demand.requests):
        requests = stream.reshape(-1)
        softmax = np.zeros((len(requests), demand.num_experts), dtype=np.float32)
        softmax[np.arange(len(requests)), requests] = 1
        hits, total = replay.policy_topk_lru(softmax, 1, capacity)
        assert total - hits == lru[s]
        hits, total = replay.policy_belady(softmax, 1, capacity)
        assert total - hits == belady[s]


def test_per_request_belady_goes_below_the_per_token_optimum():
    """On a stream where a token's experts do not all fit beside the next one's, one
    request at a time undercounts: per-request Belady is below B*, the fewest copies of any
    schedule that holds a token's experts together; per-token farthest-future equals it."""
    demand = generated(0, "bursty", streams=6, tokens=200, experts=16, k=4)
    capacity = 6
    per_token = engine.replayed(demand, "farthest-future", capacity).after_fill.sum()
    exact = bound.optimum_report(demand, capacity)["totals"]["optimum"]
    assert per_token == exact  # greedy is optimal at unit cost (docs/optimum.md)
    assert flat.replayed(demand, "farthest-future", capacity).after_fill.sum() < exact


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 4), st.integers(0, 3))
def test_compiled_rules_count_what_the_vectorised_rules_count(seed, k, spare):
    """Ragged streams, every k, capacities from k up: the compiled LRU and farthest-future
    against the vectorised rules' step (engine.run with keep, which never compiles)."""
    rng = np.random.default_rng(seed)
    experts = int(rng.integers(k + 1, 20))
    capacity = min(experts, k + spare)
    streams = int(rng.integers(1, 5))
    requests = optimum.generate(rng, "bursty", streams, 40, experts, k)
    cut = [requests[s, : rng.integers(1, 41)] for s in range(streams)]
    padded_requests, lengths = padded(cut, k)
    demand = Demand(
        [f"s{i}" for i in range(streams)], ["x"] * streams, padded_requests, lengths, experts
    )
    for rule in ("lru", "farthest-future"):
        fast = engine.run(demand, engine.make_rule(rule, demand, capacity))
        slow = engine.run(demand, engine.make_rule(rule, demand, capacity), keep=True)
        for field in engine.FIELDS:
            assert (getattr(fast, field) == getattr(slow, field)).all(), (rule, field)


def test_replay_per_request_command(tmp_path):
    demand = generated(3, "bursty", streams=2, tokens=30, experts=8, k=2)
    lines = [
        json.dumps({"stream": name, "tokens": demand.requests[s].tolist()})
        for s, name in enumerate(demand.streams)
    ]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "moecache", "replay", "--demand", str(tmp_path / "d.jsonl")]
        + ["--experts", "8", "--capacity", "3", "--rule", "lru", "--per-request", "--json"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["counting"] == "per-request" and report["tokens"] == 60
    assert report["rules"]["lru"]["totals"]["insertions"] == per_request(demand, "lru", 3).sum()


def test_the_pipelines_per_request_numbers(tmp_path):
    """results/replay/<shard>/per-request.json (the pipeline's replay_per_request) beside
    replay.json: the numbers block sets the two countings side by side."""
    from moecache.records.replay import stamped
    from moecache.report.numbers.replay import replay_section

    demand = generated(4, "bursty", streams=3, tokens=60, experts=16, k=4)
    folder = tmp_path / "results/replay/a"
    folder.mkdir(parents=True)
    per_token = engine.report(demand, 6)
    (folder / "replay.json").write_text(json.dumps(stamped(per_token)))
    (folder / "bound.json").write_text(json.dumps(stamped(bound.report(demand, 6))))
    per_request_report = flat.report(demand, 6, ["lru", "farthest-future"])
    (folder / "per-request.json").write_text(json.dumps(stamped(per_request_report)))
    section = replay_section(tmp_path, ["a"])
    lru = per_token["rules"]["lru"]["totals"]["insertions"]
    belady = per_request_report["rules"]["farthest-future"]["totals"]["insertions"]
    assert f"| shard a, C = 6 | {lru:,} |" in section and f"| {belady:,} |" in section
