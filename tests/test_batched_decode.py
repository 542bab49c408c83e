"""Batched decoding in the harness: on a tiny random OLMoE, B sequences decoded at once keep
each sequence's batch-one NLL under lossless rules, record the union demand the batched
replay derives from the batch-one trace, copy exactly what the batched replay counts
(rounds included, where a union is wider than the pool) and never hold more than C."""

from __future__ import annotations

import pytest
from sharp_model import random_sequences, sharp_model

from moecache.config import run_spec
from moecache.errors import MoecacheError
from moecache.harness import batched, batched_runs, decode, gates
from moecache.harness.pool import ExpertPool
from moecache.harness.union_block import UnionBlock
from moecache.records import trace
from moecache.records.demand import PAD
from moecache.records.trace import read_demand as read_traced
from moecache.records.trace import read_futures
from moecache.replay import batch as replay_batch
from moecache.replay.engine import parse_rule

LAYERS, EXPERTS, TOP_K = [1, 2], 16, 4
LENGTHS = [12, 9, 15, 7, 11]  # unequal: sequences leave their batch at different steps
RULES = ["lru", "farthest-future", "decayed-frequency", "lirs"]


@pytest.fixture(scope="module")
def model():
    return sharp_model()


@pytest.fixture(scope="module")
def sequences():
    return random_sequences(LENGTHS)


@pytest.fixture(scope="module")
def batch_one(model, sequences, tmp_path_factory):
    """The batch-one LRU run: each sequence's NLL, its trace as demand and as futures."""
    make = decode.policy_factory(run_spec("lru"), 8, EXPERTS, TOP_K)
    with decode.offloaded(model, LAYERS, 8, "cpu", 1) as off:
        arm = off.arm("lru", make, 8)
        result = decode.decode(model, sequences, "cpu", [arm], off.own, warmup_tokens=2)["lru"]
    path = tmp_path_factory.mktemp("trace") / "lru.parquet"
    trace.write(result["trace"], path, {})
    nll = [row["nll_sum"] for row in result["sequences"]]
    return nll, read_traced(path), read_futures(path, LAYERS)


def run_batched(model, sequences, rule, capacity, size, width, futures=None, **how):
    """`rule` decoded `size` at a time (`how`: decode_batched's keywords), built as the
    replay builds it, for requests of min(W, C) experts (`width`: W)."""
    name, params = parse_rule(rule)
    spec = run_spec(name, params)
    make = batched.policy_factory(spec, capacity, EXPERTS, TOP_K, size, width)
    with decode.offloaded(model, LAYERS, capacity, "cpu", 1) as off:
        arm = off.arm(rule, make, capacity, block=UnionBlock)
        return batched_runs.decode_batched(
            model, sequences, "cpu", arm, off.own, size, futures, **how
        )


@pytest.fixture
def held(monkeypatch):
    """The most experts any pool held after a copy."""
    most = [0]
    apply = ExpertPool.apply

    def spy(self, plan):
        apply(self, plan)
        most[0] = max(most[0], len(self.slot_of))

    monkeypatch.setattr(ExpertPool, "apply", spy)
    return most


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize(("size", "capacity"), [(1, 8), (2, 8), (4, 8), (2, 6)])
def test_batched_lossless_runs_equal_batch_one_and_the_replay(
    model, sequences, batch_one, held, rule, size, capacity
):
    nll, demand, futures = batch_one
    union_demand = replay_batch.batched(demand, size, "static")
    got = run_batched(model, sequences, rule, capacity, size, union_demand.top_k, futures)
    for row in got["sequences"]:  # every sequence's routing unchanged: its batch-one NLL
        assert row["nll_sum"] / row["scored"] == pytest.approx(
            nll[row["sequence"]] / row["scored"], abs=gates.POOL_TOLERANCE / 10
        )
    assert recorded_unions(got["trace"]) == replayed_unions(union_demand)
    counts = replay_batch.serve(union_demand, rule, capacity)
    want = {
        name: (int(counts.insertions[s]), int(counts.fills[s]), int(counts.steady[s]))
        for s, name in enumerate(union_demand.streams)
    }
    have = {
        f"layer{layer}/batch{row['batch']}": (c["insertions"], c["fills"], c["steady"])
        for row in got["batches"]
        for layer, c in row["layers"].items()
    }
    assert have == want
    assert sum(c[2] for c in have.values()) > 0  # the pools were full: eviction mattered
    assert 0 < held[0] <= capacity
    assert got["totals"]["batch"] == replay_batch.described(union_demand, capacity)


def test_unions_wider_than_the_pool_are_served_in_rounds(model, sequences, batch_one, held):
    _, demand, futures = batch_one
    width = replay_batch.batched(demand, 4, "static").top_k
    got = run_batched(model, sequences, "lru", 6, 4, width, futures)
    assert got["totals"]["batch"]["widest_union"] > 6
    assert got["totals"]["batch"]["steps_in_rounds"] > 0
    assert max(step["rounds"] for step in got["trace"]) >= 2
    assert held[0] == 6


def test_timing_is_per_step_and_per_sequence_token(model, sequences, batch_one):
    _, demand, _ = batch_one
    got = run_batched(model, sequences, "lru", 8, 2, 8)
    first = got["batches"][0]
    # A step's seconds are split over the sequences running in it; the first is untimed.
    assert len(first["step_seconds_each"]) == max(LENGTHS[:2]) - 1
    assert first["running_each"] == [2] * (min(LENGTHS[:2]) - 1) + [1] * (
        max(LENGTHS[:2]) - min(LENGTHS[:2])
    )
    shares = sum(r["step_seconds"] for r in got["sequences"] if r["batch"] == 0)
    assert shares == pytest.approx(sum(first["step_seconds_each"]))
    totals = got["totals"]
    assert totals["timed_tokens"] == demand.timed_tokens
    assert totals["copies_per_token"] == totals["timed_copies"] / demand.timed_tokens
    assert totals["batch"]["size"] == 2


def test_a_policy_that_reads_the_router_is_refused_in_one_line(model, sequences):
    name, params = parse_rule("router-logit")
    make = decode.policy_factory(run_spec(name, params), 8, EXPERTS, TOP_K)
    with decode.offloaded(model, LAYERS, 8, "cpu", 1) as off:
        arm = off.arm("router-logit", make, 8, block=UnionBlock)
        with pytest.raises(MoecacheError) as refused:
            batched_runs.decode_batched(model, sequences, "cpu", arm, off.own, 2)
    assert "policy router-logit reads the router's probabilities" in str(refused.value)
    assert "\n" not in str(refused.value)


def recorded_unions(trace: list[dict]) -> dict:
    """The union demand a batched run recorded: (layer, batch) -> each step's union."""
    out: dict = {}
    for step in trace:
        out.setdefault((step["layer"], step["batch"]), []).append(list(step["requested"]))
    return out


def replayed_unions(union_demand) -> dict:
    """The same from the batched replay's streams ("layer<L>/batch<b>"): (layer, batch) ->
    each step's union."""
    out = {}
    for s, name in enumerate(union_demand.streams):
        layer, tag = name.split("/")
        rows = union_demand.requests[s, : union_demand.lengths[s]]
        out[(int(layer.removeprefix("layer")), int(tag.removeprefix("batch")))] = [
            [int(e) for e in row if e != PAD] for row in rows
        ]
    return out
