"""Batched replay (moecache.replay.batch): union demand from a batch-1 trace, steps wider
than the pool served in rounds, checked against a plain-Python simulation of the union."""

from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest
from conftest import BIN, env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moecache.errors import MoecacheError
from moecache.policies.lru import LRU
from moecache.records import batch as geometry
from moecache.records.demand import Demand, padded
from moecache.replay import batch, bound, engine

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def demand_of(sequences: list[list[list[int]]], num_experts: int) -> Demand:
    """One layer: sequence i is the stream layer0/seq<i>."""
    tokens = [np.array(s, dtype=np.int64) for s in sequences]
    requests, lengths = padded(tokens, len(sequences[0][0]))
    names = [f"layer0/seq{i}" for i in range(len(sequences))]
    return Demand(names, [n.split("/")[1] for n in names], requests, lengths, num_experts)


# -- an independent simulation ------------------------------------------------------------


def schedule(sequences, size: int, batching: str) -> list[list[list[list[int]]]]:
    """Per union stream, per step, the tokens of the running sequences in slot order: a
    step-by-step simulation of the slots (static: batches of `size`, all from step 0)."""
    if batching == "static":
        groups = [sequences[i : i + size] for i in range(0, len(sequences), size)]
        return [
            [[s[t] for s in group if t < len(s)] for t in range(max(map(len, group)))]
            for group in groups
        ]
    waiting, slots, steps = list(sequences), [None] * size, []
    while waiting or any(slots):
        for i in range(size):
            if slots[i] is None and waiting:
                slots[i] = [waiting.pop(0), 0]  # (sequence, next token)
        steps.append([s[0][s[1]] for s in slots if s])
        for i, s in enumerate(slots):
            if s:
                s[1] += 1
                if s[1] == len(s[0]):
                    slots[i] = None
    return [steps]


def union_of(tokens: list[list[int]]) -> list[int]:
    """Slot after slot, each token in its order, a repeat left out."""
    return list(dict.fromkeys(e for token in tokens for e in token))


def simulate(stream: list[list[int]], capacity: int, rule: str) -> int:
    """Insertions of LRU or farthest-future over a union stream, in plain Python: a step
    wider than the pool is served in rounds (residents first, then the rest, each by id).
    Recency: a request's experts are used at its step, in their place in the request."""
    unions = [union_of(tokens) for tokens in stream]
    resident, used, copies = set(), {}, 0
    for t, wanted in enumerate(unions):
        parts = [wanted]
        if len(wanted) > capacity:
            order = sorted(e for e in wanted if e in resident) + sorted(
                e for e in wanted if e not in resident
            )
            parts = [order[i : i + capacity] for i in range(0, len(order), capacity)]
        for part in parts:
            missing = [e for e in part if e not in resident]
            spare = sorted(resident - set(part), key=lambda e: rank(e, t, unions, used, rule))
            for victim in spare[: max(0, len(resident) + len(missing) - capacity)]:
                resident.remove(victim)
            resident |= set(missing)
            copies += len(missing)
            assert len(resident) <= capacity
            for place, e in enumerate(part):
                used[e] = (t, place)
    return copies


def rank(e, t, unions, used, rule):
    """Eviction order, first out first: LRU by last use; farthest-future by next use
    (farthest first), then last use; then the lower id."""
    if rule == "lru":
        return (used[e], e)
    following = next((u for u in range(t + 1, len(unions)) if e in unions[u]), math.inf)
    return (-following, used[e], e)


@st.composite
def batched_cases(draw):
    n = draw(st.integers(2, 8))
    k = draw(st.integers(1, min(3, n)))
    count = draw(st.integers(1, 5))
    sequences = [
        [draw(st.permutations(range(n)))[:k] for _ in range(draw(st.integers(1, 6)))]
        for _ in range(count)
    ]
    size = draw(st.integers(1, 4))
    capacity = draw(st.integers(k, n))
    return sequences, n, size, draw(st.sampled_from(geometry.MODES)), capacity


@SETTINGS
@given(batched_cases())
def test_batched_counts_equal_a_plain_simulation_of_the_union(case):
    """Unions wider than C included: those are served in rounds."""
    sequences, n, size, batching, capacity = case
    union_demand = batch.batched(demand_of(sequences, n), size, batching)
    streams = schedule(sequences, size, batching)
    assert len(union_demand.streams) == len(streams)
    for rule in ("lru", "farthest-future"):
        counts = batch.serve(union_demand, rule, capacity)
        expected = [simulate(stream, capacity, rule) for stream in streams]
        assert counts.insertions.tolist() == expected, rule


# -- rounds -------------------------------------------------------------------------------


class Watched:
    """A rule that records, before each request it serves, its width and the pool's size."""

    needs_future = False

    def __init__(self, policy):
        self.policy, self.seen = policy, []

    def reset(self, future=None, streams=1):
        self.policy.reset(future, streams)

    def step(self, t, at, probs, pools):
        self.seen.append((t, at.shape[1], int(pools.resident.sum())))
        self.pools = pools
        return self.policy.step(t, at, probs, pools)


def test_a_union_over_capacity_is_served_in_rounds_that_never_overfill_the_pool():
    # Two sequences of four experts each: a union of 8 experts, C = 3.
    demand = demand_of([[[0, 1, 2, 3], [0, 1, 2, 3]], [[4, 5, 6, 7], [4, 5, 6, 7]]], 8)
    union_demand = batch.batched(demand, 2)
    watched = Watched(LRU(3, 8, 3))
    copies, _, _ = batch.one_stream(union_demand, 0, watched, 3)
    # Step 0 from empty: 0 1 2 | 3 4 5 | 6 7, which evicts 3 and 4 (least recent); step 1:
    # the residents 5 6 7 first, then 0 1 2 | 3 4.
    assert [width for _, width, _ in watched.seen] == [3, 3, 2, 3, 3, 2]
    assert all(held <= 3 for _, _, held in watched.seen)
    assert watched.pools.resident.sum() <= 3
    assert copies == [3, 3, 2, 0, 3, 2]


def test_rounds_put_the_residents_first_then_the_rest_by_id():
    resident = np.zeros(8, dtype=bool)
    resident[[6, 2]] = True
    parts = geometry.rounds(np.array([7, 6, 5, 2, 1, 0]), resident, 3)
    assert [p.tolist() for p in parts] == [[2, 6, 0], [1, 5, 7]]
    assert [p.tolist() for p in geometry.rounds(np.array([7, 6]), resident, 3)] == [[7, 6]]


# -- batch size one, and static against continuous -----------------------------------------


@SETTINGS
@given(batched_cases())
def test_batch_of_one_equals_todays_replay(case):
    sequences, n, _, _, capacity = case
    demand = demand_of(sequences, n)
    rules = ["lru", "farthest-future", "lirs", "s3-fifo", "arc", "lfu"]
    today = engine.report(demand, capacity, rules)
    batched = batch.report(demand, capacity, rules, 1, "static")
    assert batched["timed_tokens"] == today["timed_tokens"]
    for rule in rules:
        assert batched["rules"][rule]["totals"] == today["rules"][rule]["totals"], rule


def test_static_and_continuous_batching_on_a_known_trace():
    # A: 0 1 2 0; B: 3; C: 3 3 3, two at a time, k = 1, C = 2, LRU.
    demand = demand_of([[[0], [1], [2], [0]], [[3]], [[3], [3], [3]]], 4)
    static = batch.batched(demand, 2, "static")
    assert static.members == [["seq0", "seq1"], ["seq2"]]
    assert static.lengths.tolist() == [4, 3]
    # Batch 0: {0 3} {1} {2} {0}, each step a miss after the first: 2 + 1 + 1 + 1; batch 1
    # starts from an empty pool: 1.
    assert batch.serve(static, "lru", 2).insertions.tolist() == [5, 1]
    continuous = batch.batched(demand, 2, "continuous")
    # C takes B's place at step 1: {0 3} {1 3} {2 3} {0 3}, 3 stays: 2 + 1 + 1 + 1.
    assert continuous.members == [["seq0", "seq1", "seq2"]]
    assert continuous.lengths.tolist() == [4]
    assert batch.serve(continuous, "lru", 2).insertions.tolist() == [5]
    report = batch.report(demand, 2, ["lru"], 2, "continuous")
    assert report["timed_tokens"] == 3 + 0 + 2  # sequence-tokens after each first
    assert report["batch"]["widest_union"] == 2


# -- the bounds -----------------------------------------------------------------------------


def test_bounds_on_unions_that_fit_hold_the_sandwich():
    demand = demand_of([[[0], [2], [1], [3]], [[1], [4], [5], [0]], [[2], [3], [0], [4]]], 6)
    union_demand = batch.fitting(demand, 2, "static", 3)
    flat, best, greedy = bound.sandwich(union_demand, 3)
    assert (flat <= best).all() and (best <= greedy).all()
    assert (bound.dp(union_demand, 3) == best).all()


def test_bounds_refuse_a_union_over_capacity_in_one_line(tmp_path):
    lines = [{"stream": f"layer0/seq{i}", "tokens": [[i, i + 2], [i + 4, i]]} for i in range(2)]
    path = tmp_path / "demand.jsonl"
    path.write_text("\n".join(map(json.dumps, lines)))
    for command in ("bound", "optimum"):
        result = subprocess.run(
            [str(BIN / "moecache"), command, "--demand", str(path), "--experts", "8"]
            + ["--capacity", "3", "--batch", "2"],
            capture_output=True,
            text=True,
            env=env(),
        )
        assert result.returncode == 2
        errors = result.stderr.strip().splitlines()
        assert len(errors) == 1 and errors[0].startswith("moecache: error: --batch 2:")
        assert "top-k 4 is larger than capacity 3" in errors[0] and "widest union" in errors[0]


def test_a_batch_size_below_one_or_an_unknown_batching_is_refused():
    demand = demand_of([[[0], [1]]], 2)
    with pytest.raises(MoecacheError, match="--batch 0: must be at least 1"):
        batch.batched(demand, 0)
    with pytest.raises(MoecacheError, match="--batching dynamic: known are static, continuous"):
        batch.batched(demand, 2, "dynamic")
