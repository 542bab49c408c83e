"""LRU at several experts per token: ties of last use follow the token's request order.

Experts last used by the same token are ordered as an ordered map of last use would order
them (move_to_end for each requested expert, in request order): the one requested earlier
counts as less recent and is evicted first. The checks: LRU equals such a map on random
streams, a hand-built stream where only that order decides the victim, the same victims
from replay (`step`, many streams) and the harness path (`plan`, one stream) for every rule
that breaks ties by recency, and the request order kept from the trace to the policy.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_policies import LOSSLESS, router_probs, simulate, uniform_probs

from moecache.policies import POLICIES, EventPolicy, EvictionPolicy, make
from moecache.records import trace
from moecache.records.demand import Demand, padded
from moecache.records.trace import read_demand as read_traced
from moecache.records.trace import read_futures
from moecache.replay import engine

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def lru_reference(stream, capacity: int) -> list[tuple[list[int], list[int]]]:
    """Per-token LRU with an OrderedDict (least recent first): per token the misses are
    copied in together, the victims are the least recent residents the token does not
    need, and then every requested expert moves to the end in request order. Returns
    (admitted in request order, victims sorted) per token."""
    cache: OrderedDict[int, None] = OrderedDict()
    out = []
    for request in stream:
        admit = [e for e in request if e not in cache]
        surplus = len(cache) + len(admit) - capacity
        victims = [e for e in cache if e not in request][: max(0, surplus)]
        for e in victims:
            del cache[e]
        for e in request:
            cache[e] = None
            cache.move_to_end(e)
        assert len(cache) <= capacity
        out.append((admit, sorted(victims)))
    return out


@st.composite
def streams(draw, top_k=(2, 5), max_experts=16, max_len=60, count=1):
    """A layer shape and `count` streams whose tokens are drawn from a hot set, in random
    request order (not sorted, so that position and id disagree)."""
    k = draw(st.integers(*top_k))
    n = draw(st.integers(k + 1, max_experts))
    capacity = draw(st.integers(k, n))
    hot = draw(st.integers(k, n))
    request = st.lists(st.sampled_from(range(hot)), min_size=k, max_size=k, unique=True)
    drawn = [draw(st.lists(request, min_size=1, max_size=max_len)) for _ in range(draw(count))]
    return n, capacity, k, drawn


@SETTINGS
@given(streams(count=st.just(1)))
def test_lru_is_an_ordered_map_of_last_use(case):
    """LRU's copies and victims, token by token, equal the OrderedDict reference."""
    n, capacity, k, (stream,) = case
    run = simulate(make("lru", capacity, n, k, {}), stream)
    expected = lru_reference(stream, capacity)
    assert run.plans() == expected
    assert run.insertions == sum(len(admit) for admit, _ in expected)


def test_request_order_breaks_a_tie_of_last_use():
    """C = 3: token 0 requests 2 then 1, token 1 requests 0 and 3 and must evict one of
    them. Both were last used by token 0; 2 was requested first, so it is the less recent
    and goes, though 1 has the lower id (the old rule, ties to the lowest id, evicted 1 and
    then made 5 copies, not 6)."""
    stream = [[2, 1], [0, 3], [2, 4]]
    run = simulate(make("lru", 3, 5, 2, {}), stream)
    assert [s.plan.evict for s in run.steps] == [[], [2], [0, 1]]
    assert run.insertions == 6
    assert run.plans() == lru_reference(stream, 3)
    # In the other request order the tie goes the other way.
    flipped = simulate(make("lru", 3, 5, 2, {}), [[1, 2], [0, 3], [2, 4]])
    assert [s.plan.evict for s in flipped.steps] == [[], [1], [0]]
    assert flipped.insertions == 5


def test_recency_keys_follow_request_order():
    """The key is (1 + t) * top_k + position in token t's request (0: never used)."""
    policy = make("lru", 4, 8, 3, {})
    policy.reset()
    policy.change(0, [5, 2, 7], uniform_probs(8, [5, 2, 7]), frozenset())
    plan = policy.change(1, [2, 6, 0], uniform_probs(8, [2, 6, 0]), frozenset({5, 2, 7}))
    assert plan.evict == [5]
    assert policy.recency[0].tolist() == [8, 0, 6, 0, 0, 3, 7, 5]


def test_restricting_rules_drop_spares_in_request_order():
    """A refresh drops residents outside its target least recently requested first, one
    token's experts in request order (Dwell with k = 1 and window 1: the target is the
    current request). At token 1 one of token 0's 4 and 1 must go: 4, requested first; at
    token 2 one of token 1's 5 and 0: 5. (The old rule dropped 1, then 4 and 0.)"""
    run = simulate(make("dwell", 3, 6, 2, {"k": 1, "window": 1}), [[4, 1], [5, 0], [1, 2]])
    assert [s.plan.evict for s in run.steps] == [[], [4], [5]]
    assert run.insertions == 5


# Every ranked rule (EvictionPolicy, not an EventPolicy: the zoo's queues and hands are
# checked the same way in tests/test_zoo.py) with the parameters tests/test_policies.py
# covers: their ties go by recency (the base class's `recency`).
RECENCY_RULES = [
    (name, params)
    for name, params in LOSSLESS
    if issubclass(POLICIES[name], EvictionPolicy) and not issubclass(POLICIES[name], EventPolicy)
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(top_k=(2, 4), count=st.integers(1, 4)), st.integers(0, 2**32 - 1))
def test_replay_and_harness_give_the_same_victims(case, seed):
    """Replay, all streams at once, evicts token by token exactly what the harness path
    (plan, one stream) evicts, for every rule whose ties go by recency."""
    n, capacity, k, drawn = case
    requests, lengths = padded([np.array(s) for s in drawn], k)
    names = [f"s{i}" for i in range(len(drawn))]
    probs = np.zeros((*requests.shape[:2], n), dtype=np.float32)
    for i, stream in enumerate(drawn):
        probs[i, : len(stream)] = router_probs(n, stream, seed + i)
    demand = Demand(names, names, requests, lengths, n, probs)
    assert {"lru", "farthest-future"} <= {name for name, _ in RECENCY_RULES}
    for name, params in RECENCY_RULES:
        text = name + (":" + ",".join(f"{key}={v}" for key, v in params.items()) if params else "")
        counts = engine.run(demand, engine.make_rule(text, demand, capacity), keep=True)
        for i, stream in enumerate(drawn):
            policy = make(name, capacity, n, k, params)
            single = simulate(policy, stream, list(probs[i, : len(stream)].astype(float)))
            replayed = [np.flatnonzero(counts.evictions[i, t]).tolist() for t in range(len(stream))]
            assert replayed == [s.plan.evict for s in single.steps], (text, i)
            if name == "lru":
                assert single.plans() == lru_reference(stream, capacity)


def test_traces_keep_the_request_order(tmp_path):
    """A harness trace read back as demand keeps each token's requests in the router's
    order, so replay sees the ties the harness saw."""
    rows = [
        {"sequence": 0, "layer": 1, "token": t, "requested": r, "used": r, "probs": p}
        for t, r in enumerate([[2, 1], [0, 3], [3, 2]])
        for p in [uniform_probs(4, r).astype(np.float32)]
    ]
    path = tmp_path / "trace.parquet"
    trace.write(rows, path, {})
    demand = read_traced(path)
    assert demand.requests[0].tolist() == [[2, 1], [0, 3], [3, 2]]
    assert read_futures(path, [1])[1] == [[[2, 1], [0, 3], [3, 2]]]


def test_farthest_future_follows_the_run_not_the_recorded_order():
    """The recorded demand may list a token's experts in another order than the run that
    replays it; next uses still go to the right experts, and recency follows the run."""
    future = [[0, 1], [2, 3], [0, 2]]
    policy = make("farthest-future", 3, 4, 2, {})
    policy.reset(future=future)
    plans = [
        policy.change(t, r, uniform_probs(4, r), held)
        for t, r, held in [(0, [1, 0], frozenset()), (1, [3, 2], frozenset({0, 1}))]
    ]
    # Token 1 needs room for 2 and 3: 1 (never again) goes, 0 (token 2) stays.
    assert plans[1].evict == [1]
    assert policy.ahead[0].tolist() == [2, 4, 2, 4]
