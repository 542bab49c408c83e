"""Prefill apart: each sequence's first P tokens are one forward that requests their union.
P = 0 is the batched replay of today; for lossless rules the harness's prefill and decoding
copies equal the replay's and every NLL its batch-one NLL; the pool never holds more than C;
and the replay's counts equal a plain-Python simulation of the prefill union, then tokens."""

from __future__ import annotations

import numpy as np
import pytest
import test_batched_decode as shared
from hypothesis import given, settings
from hypothesis import strategies as st

from moecache import policies
from moecache.errors import MoecacheError
from moecache.harness import batched_runs, decode, gates
from moecache.harness.union_block import UnionBlock
from moecache.records.demand import PAD, Demand, padded
from moecache.replay import batch as replay_batch
from moecache.replay.engine import parse_rule

PREFILL = 4
EXPERTS, LAYERS = shared.EXPERTS, shared.LAYERS
# The tiny model, its sequences and their batch-one run, as the batched harness tests use.
model, sequences, batch_one, held = shared.model, shared.sequences, shared.batch_one, shared.held


def run_prefilled(model, sequences, rule, capacity, size, width, futures, prefill):
    name, params = parse_rule(rule)

    def make():
        return policies.make(name, capacity, EXPERTS, min(width, capacity), params)

    with decode.offloaded(model, LAYERS, capacity, "cpu", 1) as off:
        arm = off.arm(rule, make, capacity, block=UnionBlock)
        return batched_runs.decode_batched(
            model, sequences, "cpu", arm, off.own, size, futures, prefill=prefill
        )


def random_demand(seed: int, lengths: list[int], k: int = 3, experts: int = 10) -> Demand:
    rng = np.random.default_rng(seed)
    tokens = [np.array([rng.choice(experts, k, replace=False) for _ in range(n)]) for n in lengths]
    requests, n = padded(tokens, k)
    names = [f"layer0/s{i}" for i in range(len(lengths))]
    return Demand(names, [f"s{i}" for i in range(len(lengths))], requests, n, experts)


@pytest.mark.parametrize("size", [1, 3])
def test_prefill_zero_is_the_batched_replay_of_today(size):
    demand = random_demand(0, [9, 6, 12, 7])
    today = replay_batch.report(demand, 5, None, size, "static")
    assert replay_batch.report(demand, 5, None, size, "static", 0) == today
    with_prefill = replay_batch.report(demand, 5, None, size, "static", 3)
    assert "prefill_copies" not in today["rules"]["lru"]["totals"]
    assert with_prefill["rules"]["lru"]["totals"]["prefill_copies"] > 0
    assert with_prefill["batch"]["sequence_tokens"] == sum(n - 3 for n in [9, 6, 12, 7])


def test_sequences_not_longer_than_the_prompt_are_refused():
    demand = random_demand(0, [9, 3, 12])
    with pytest.raises(MoecacheError, match="--prefill 3: sequence s1 has no token left"):
        replay_batch.batched(demand, 2, "static", 3)
    with pytest.raises(MoecacheError, match="static batching only"):
        replay_batch.batched(demand, 2, "continuous", 2)


@pytest.mark.parametrize("rule", ["lru", "farthest-future"])
@pytest.mark.parametrize("size", [1, 2])
def test_harness_prefill_and_decoding_copies_equal_the_replay(
    model, sequences, batch_one, held, rule, size
):
    nll, demand, futures = batch_one
    capacity = 8
    union_demand = replay_batch.batched(demand, size, "static", PREFILL)
    got = run_prefilled(
        model, sequences, rule, capacity, size, union_demand.top_k, futures, PREFILL
    )
    for row in got["sequences"]:  # every sequence's routing unchanged: its batch-one NLL
        assert row["nll_sum"] / row["scored"] == pytest.approx(
            nll[row["sequence"]] / row["scored"], abs=gates.POOL_TOLERANCE
        )
    counts, apart = replay_batch.served(union_demand, rule, capacity)
    want = {
        name: {
            "insertions": int(counts.insertions[s]),
            "fills": int(counts.fills[s]),
            "steady": int(counts.steady[s]),
            "prefill_copies": int(apart["prefill_copies"][s]),
            "prefill_rounds": int(apart["prefill_rounds"][s]),
            "decode_copies": int(counts.insertions[s] - apart["prefill_copies"][s]),
        }
        for s, name in enumerate(union_demand.streams)
    }
    have = {
        f"layer{layer}/batch{row['batch']}": c
        for row in got["batches"]
        for layer, c in row["layers"].items()
    }
    assert have == want
    assert all(c["prefill_copies"] > 0 and c["decode_copies"] > 0 for c in have.values())
    assert max(c["prefill_rounds"] for c in have.values()) >= 2  # a prompt wider than C
    assert 0 < held[0] <= capacity
    assert got["totals"]["batch"] == replay_batch.described(union_demand, capacity)
    assert got["totals"]["timed_tokens"] == sum(len(s) - PREFILL for s in sequences)
    assert got["totals"]["prefill_seconds"] > 0


def lru_copies(steps: list[list[int]], capacity: int) -> list[int]:
    """Plain LRU over union steps, each served in rounds; copies per step. Recency is
    (step, place in its round), ties to the lower id, as the rules define it."""
    last: dict[int, tuple[int, int]] = {}
    out = []
    for t, union in enumerate(steps):
        if len(union) <= capacity:
            parts = [union]
        else:
            order = sorted(e for e in union if e in last) + sorted(
                e for e in union if e not in last
            )
            parts = [order[i : i + capacity] for i in range(0, len(order), capacity)]
        copies = 0
        for part in parts:
            missing = [e for e in part if e not in last]
            spare = [e for e in last if e not in part]
            extra = len(last) + len(missing) - capacity
            for e in sorted(spare, key=lambda e: (last[e], e))[: max(extra, 0)]:
                del last[e]
            copies += len(missing)
            for place, e in enumerate(part):
                last[e] = (t, place)
        out.append(copies)
    return out


def plain_unions(tokens: list[np.ndarray], prefill: int) -> list[list[int]]:
    """A static batch's union steps: the members' first P tokens at once, then token by
    token from P, member after member, each in its router's order, a repeat left out."""
    steps = [[e for ids in tokens for row in ids[:prefill] for e in row]]
    for t in range(prefill, max(map(len, tokens))):
        steps.append([e for ids in tokens if t < len(ids) for e in ids[t]])
    return [list(dict.fromkeys(int(e) for e in step)) for step in steps]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    lengths=st.lists(st.integers(4, 12), min_size=1, max_size=5),
    size=st.integers(1, 3),
    prefill=st.integers(1, 3),
    capacity=st.integers(3, 9),
)
def test_replay_prefill_equals_a_plain_simulation(seed, lengths, size, prefill, capacity):
    demand = random_demand(seed, lengths)
    union_demand = replay_batch.batched(demand, size, "static", prefill)
    counts, apart = replay_batch.served(union_demand, "lru", capacity)
    for s, members in enumerate(union_demand.members):
        tokens = [demand.requests[demand.sequences.index(q)] for q in members]
        tokens = [ids[ids[:, 0] != PAD] for ids in tokens]
        copies = lru_copies(plain_unions(tokens, prefill), capacity)
        assert int(apart["prefill_copies"][s]) == copies[0]
        assert int(counts.insertions[s]) == sum(copies)
