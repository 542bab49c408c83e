"""Overlapped decoding on a tiny random OLMoE: copies beside the compute keep the blocking
runs' NLL and demand, a slowed copy worker shows as stall, the oracle prefetcher hides
every copy it can, no schedule beats the LP's fewest insertions, and a pool never evicts
what the current token needs or what is in flight."""

from __future__ import annotations

import functools
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sharp_model import random_sequences, sharp_model

from moecache import policies
from moecache.config import run_spec
from moecache.errors import MoecacheError
from moecache.harness import copy_engine, decode
from moecache.harness.async_pool import AsyncExpertPool
from moecache.harness.link import SlowLink
from moecache.harness.overlapped_block import overlapped, rule_victims
from moecache.harness.pool import HostExperts
from moecache.model import tiny
from moecache.policies import PoolChange
from moecache.records import trace
from moecache.records.trace import read_demand as read_traced
from moecache.replay import bound

LAYERS, EXPERTS, TOP_K, CAPACITY = [1, 2], 16, 4, 8
LENGTHS = [14, 9, 11]


@pytest.fixture(scope="module")
def model():
    return sharp_model(per_expert=True)


@pytest.fixture(scope="module")
def sequences():
    return random_sequences(LENGTHS)


def run(model, sequences, arms_of, multiplier=1):
    """Decode the arms `arms_of(off, make)` builds; `make(rule)` a policy factory."""

    def make(rule, **params):
        spec = run_spec(rule, params)
        return decode.policy_factory(spec, CAPACITY, EXPERTS, TOP_K)

    with decode.offloaded(model, LAYERS, CAPACITY, "cpu", 1) as off:
        arms = arms_of(off, make, multiplier)
        return decode.decode(model, sequences, "cpu", arms, off.own, warmup_tokens=2)


def base_and(*overlapped_arms):
    """The blocking LRU arm (whose demand the others read) and the given overlapped arms."""

    def arms_of(off, make, m):
        arms = [off.arm("lru", make("lru"), CAPACITY, m)]
        for name, rule, prefetch in overlapped_arms:
            name_of, params = prefetch if isinstance(prefetch, tuple) else (prefetch, {})
            block = overlapped(name_of, **params)
            arms.append(off.arm(name, make(rule), CAPACITY, m, future_of="lru", block=block))
        return arms

    return arms_of


def requested(result):
    return [(s["sequence"], s["layer"], s["token"], s["requested"]) for s in result["trace"]]


@pytest.mark.parametrize("rule", ["lru", "farthest-future"])
def test_overlapped_lossless_runs_keep_the_blocking_nll_and_demand(model, sequences, rule):
    prefetchers = ["none", "pregate", "oracle"]

    def arms_of(off, make, m):
        arms = base_and(*[(f"{rule}/{p}", rule, p) for p in prefetchers])(off, make, m)
        return [*arms, off.arm(rule + "/blocking", make(rule), CAPACITY, m, future_of="lru")]

    results = run(model, sequences, arms_of)
    blocking = results[rule + "/blocking"]
    for p in prefetchers:
        result = results[f"{rule}/{p}"]
        nll = [row["nll_sum"] for row in result["sequences"]]
        assert nll == [row["nll_sum"] for row in blocking["sequences"]], p
        assert requested(result) == requested(blocking), p
        for row in result["sequences"]:  # every insertion is a demand copy or a prefetch
            assert row["timed_copies"] == row["demand_copies"] + row["prefetch_copies"]
            assert row["prefetch_used"] + row["prefetch_wasted"] == row["prefetch_copies"]
            # The demand groups hold every demand copy; each layer computes TOP_K experts.
            assert sum(d * n for d, _, n in row["demand_groups"]) == row["demand_copies"]
            assert all(0 <= j < TOP_K for _, j, _ in row["demand_groups"])
            assert row["experts_computed"] == row["timed_tokens"] * len(LAYERS) * TOP_K
    assert results[f"{rule}/none"]["totals"]["prefetch_copies"] == 0
    # Without prefetching, the overlapped run copies exactly what the blocking one does.
    assert results[f"{rule}/none"]["totals"]["timed_copies"] == blocking["totals"]["timed_copies"]


def test_restricting_policy_runs_overlapped_with_the_blocking_nll(model, sequences):
    def arms_of(off, make, m):
        dwell = make("dwell", k=4)
        return [
            off.arm("dwell", dwell, CAPACITY, m),
            off.arm("dwell/none", dwell, CAPACITY, m, block=overlapped("none")),
        ]

    results = run(model, sequences, arms_of)
    nll = [[row["nll_sum"] for row in r["sequences"]] for r in results.values()]
    assert nll[0] == nll[1]
    assert requested(results["dwell"]) == requested(results["dwell/none"])


def test_a_slowed_copy_worker_shows_as_stall(model, sequences, monkeypatch):
    """Every copy held 20 ms on the worker: each token and layer that copies on demand
    stalls its compute nearly that long, and the rows count it as copy time, not compute."""
    hold = 0.02
    monkeypatch.setattr(copy_engine.HostCopyEngine, "hold", lambda self, *_: time.sleep(hold))
    result = run(model, sequences[:2], base_and(("lru/none", "lru", "none")))["lru/none"]
    for row in result["sequences"]:
        steps = {
            (s["layer"], s["token"])
            for s in result["trace"]
            if s["sequence"] == row["sequence"] and s["token"] > 0 and s["copied"]
        }
        assert row["stall_seconds"] >= 0.75 * hold * len(steps)
        assert row["copy_seconds"] == row["stall_seconds"]  # out of compute_ms


def test_oracle_at_1x_hides_every_copy_it_can(model, sequences):
    """The oracle fetches each layer's recorded demand one layer ahead (the first layer's
    from the last layer of the token before): after the first token no copy is on demand,
    and every prefetch is used."""
    result = run(model, sequences, base_and(("lru/oracle", "lru", "oracle")))["lru/oracle"]
    for row in result["sequences"]:
        assert row["demand_copies"] == 0
        assert row["prefetch_used"] == row["prefetch_copies"] > 0
        assert row["prefetch_wasted"] == 0
    assert result["totals"]["prefetch_accuracy"] == 1.0


def test_insertions_stay_at_or_above_the_lp_bound(model, sequences, tmp_path):
    arms = [
        ("lru/pregate", "lru", "pregate"),
        ("lru/oracle", "lru", "oracle"),
        ("lru/lookahead", "lru", ("lookahead", {"k": 3})),
        ("ff/oracle", "farthest-future", "oracle"),
    ]
    results = run(model, sequences, base_and(*arms))
    path = tmp_path / "lru.parquet"
    trace.write(results["lru"]["trace"], path, {})
    fewest = bound.lp_optimum(read_traced(path), CAPACITY).copies.sum()
    for name, *_ in arms:
        inserted = sum(r["fills"] + r["steady"] for r in results[name]["sequences"])
        assert inserted >= fewest, name


def test_an_oracle_arm_without_a_trace_is_refused(model, sequences):
    def arms_of(off, make, m):
        return [off.arm("lru/oracle", make("lru"), CAPACITY, m, block=overlapped("oracle"))]

    with pytest.raises(MoecacheError, match="recorded demand"):
        run(model, sequences[:1], arms_of)


def test_prefetching_under_a_restricting_policy_is_refused(model):
    make = decode.policy_factory(run_spec("dwell"), CAPACITY, EXPERTS, TOP_K)
    with decode.offloaded(model, LAYERS, CAPACITY, "cpu", 1) as off:
        with pytest.raises(MoecacheError, match="lossless eviction rule"):
            off.arm("dwell/pregate", make, CAPACITY, block=overlapped("pregate"))


# -- the pool on its own


def small_pool(capacity=4, experts=8):
    layer = {"hidden_size": 8, "intermediate_size": 4, "num_experts": experts}
    module = tiny.experts("olmoe", {**layer, "num_experts_per_tok": 2}, torch.float32, 0)
    host = HostExperts(module, capacity, "cpu")
    link = SlowLink(host.first_expert(), "cpu", 1, False, capacity)
    return AsyncExpertPool(host, capacity, 1, link, copy_engine.make("cpu", 1, link)), host


def test_a_plan_or_prefetch_evicting_a_needed_or_in_flight_expert_is_refused():
    pool, host = small_pool()
    pool.begin(0, [0, 1], needed=[0, 1])
    pool.apply(PoolChange(admit=[0, 1]))
    with pytest.raises(MoecacheError, match=r"refused to evict expert\(s\) \[0\]"):
        pool.apply(PoolChange(admit=[2], evict=[0]))
    pool.wait(0), pool.wait(1)
    pool.end(0)
    pool.prefetch([2, 3], deadline=1, victims=lambda protected, n: [])
    with pytest.raises(MoecacheError, match=r"refused to evict expert\(s\) \[2\]"):
        pool.prefetch([4, 5], deadline=1, victims=lambda protected, n: [2, 0])
    # Once its token is over, a landed prefetch is no longer in flight: it may go.
    pool.end(1)
    pool.prefetch([4, 5], deadline=2, victims=lambda protected, n: [2, 0])
    assert set(pool.resident) == {1, 3, 4, 5}
    for e in pool.resident:  # every slot holds its expert's weights
        pool.wait(e)
        for name, slots in host.slots.items():
            assert torch.equal(slots[pool.slot_of[e]], host.host[name][e])


def test_a_tokens_demand_group_counts_the_compute_before_its_last_copy():
    pool, _ = small_pool(capacity=8)
    pool.count_demand([], [1, 2, 3], waits_first=False)  # no copy: no group
    pool.count_demand([5, 2], [2, 7, 5, 1], waits_first=False)  # waits on 5 after 2 experts
    pool.count_demand([6], [6, 1], waits_first=False)  # waits first: nothing hides
    pool.count_demand([3], [4, 3], waits_first=True)  # a fused kernel waits for all first
    pool.count_demand([9, 8], [4, 5], waits_first=False)  # unused copies: all hide them
    assert pool.counts()["demand_groups"] == [[1, 0, 2], [2, 2, 2]]
    assert pool.counts()["experts_computed"] == 3 + 4 + 2 + 2 + 2


def test_the_rule_names_no_protected_victim():
    policy = policies.make("lru", 4, 8, 2, {})
    policy.reset()
    for t, request in enumerate([[0, 1], [2, 3], [4, 5]]):
        policy.change(t, request, None, set(range(min(2 * t, 4))))
    chosen = rule_victims(policy, 3, {0, 1, 2, 3}, {0, 2}, 2)
    assert chosen == [1, 3]  # least recently used first, never 0 or 2


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.sets(st.integers(0, 7), min_size=2, max_size=2), st.lists(st.integers(0, 7))),
        min_size=1,
        max_size=12,
    )
)
def test_a_pool_never_holds_more_than_capacity_resident_or_in_flight(steps):
    pool, _ = small_pool()
    policy = policies.make("lru", 4, 8, 2, {})
    policy.reset()
    for t, (request, ahead) in enumerate(steps):
        request = sorted(request)
        pool.begin(t, request, request)
        plan = policy.change(t, request, None, pool.resident)
        pool.settle(plan.evict)
        pool.apply(plan)
        assert len(pool.slot_of) <= pool.capacity
        for e in request:
            pool.wait(e)
        pool.end(t)
        victims = functools.partial(rule_victims, policy, t + 1, pool.resident)
        pool.prefetch(ahead, t + 1, victims)
        held = list(pool.slot_of.values())
        assert len(held) <= pool.capacity
        assert len(set(held)) == len(held)  # no slot holds two experts
        assert sorted(held + pool.free) == list(range(pool.capacity))
