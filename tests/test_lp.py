"""moecache.replay.lp: the LP over bridged gaps against the exact DP (random and every sweep
shape), against farthest-future at unit cost (the exchange argument of docs/optimum.md), a
weighted DP and a hand counterexample with non-unit costs, its schedules and its error
messages; the bound job's B* and its mixed-precision experiment. Farthest-future with
reload costs (the policy, replayed) is held to an oracle computed apart: the scan over the
LP's gaps of docs/optimum.md, Section 3 (`greedy_stream`)."""

from __future__ import annotations

import heapq
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from moecache.errors import MoecacheError
from moecache.records.demand import PAD, Demand
from moecache.replay import bound, lp
from moecache.replay.bound import farthest_future
from moecache.replay.optimum import KINDS, exact_insertions, generate

CONFIGS = [Path(__file__).parents[1] / "config" / name for name in ("config.yaml", "olmoe.yaml")]


# -- the oracle: farthest-future as a scan over gaps ---------------------------------------

RULES = ("farthest-future", "cheapest")


class Greedy(NamedTuple):
    cost: float  # copies priced, first loads included
    copies: int
    after_fill: int


def greedy_stream(
    requests, num_experts: int, capacity: int, costs=None, rule: str = "farthest-future"
) -> Greedy:
    """The test oracle of farthest-future (the policy, replayed): an on-demand eviction
    rule's cost on one stream, computed apart, as a left-to-right scan over the LP's gaps
    (docs/optimum.md, Section 3).

    At each token the gaps still bridged that span it must fit in C - |S_t|; while they do
    not, one is dropped (its expert is evicted there and copied back at its next use).
    `farthest-future` drops the one whose next use is farthest (ties: the least recently
    used; of experts last used by one token, the one it requested first), exactly the
    project's FarthestFuture policy; `cheapest` drops the one cheapest to reload (ties as
    farthest-future), FarthestFuture given the costs.
    """
    stream = lp._stream(requests, num_experts, capacity)
    w_expert = lp._costs(costs, num_experts)
    g = lp.gaps(stream)
    weight = np.ones(len(g.expert)) if w_expert is None else w_expert[g.expert]
    first_cost = float(g.distinct if w_expert is None else w_expert[g.first_experts].sum())
    room = capacity - g.width
    opening = [[] for _ in range(g.tokens + 1)]  # gaps by the first token they span
    for i, a in enumerate(g.start.tolist()):
        opening[a + 1].append(i)
    closing = np.zeros(g.tokens + 1, dtype=np.int64)  # bridged gaps ending at t, still held
    kept = np.ones(len(weight), dtype=bool)
    ends, begins, ws = (x.tolist() for x in (g.end, g.start, weight))
    # Where each gap's expert stands in the request that opens it: the order of recency.
    places = (stream[g.start] == g.expert[:, None]).argmax(axis=1).tolist()
    heap: list[tuple] = []
    active, dropped_cost, dropped = 0, 0.0, 0
    for t in range(g.tokens):
        active -= int(closing[t])
        for i in opening[t]:
            active += 1
            closing[ends[i]] += 1
            key = (-ends[i], begins[i], places[i], i)
            heapq.heappush(heap, key if rule == "farthest-future" else (ws[i], *key))
        while active > room[t]:
            i = heapq.heappop(heap)[-1]
            if ends[i] <= t or not kept[i]:
                continue  # already over
            kept[i] = False
            closing[ends[i]] -= 1
            active -= 1
            dropped += 1
            dropped_cost += ws[i]
    copies = g.distinct + dropped
    return Greedy(first_cost + dropped_cost, copies, copies - min(capacity, g.distinct))


def greedy(requests, num_experts, capacity, costs=None, rule="farthest-future") -> list[Greedy]:
    return [greedy_stream(s, num_experts, capacity, costs, rule) for s in requests]


def check(result, expected_copies):
    """The LP's copies equal `expected_copies`; its solution is 0/1 and dual-certified."""
    assert result.status == "Optimal"
    assert result.integral and result.max_fractionality <= lp.INTEGRAL_TOL
    assert result.certified
    assert result.copies == result.cost == expected_copies


@st.composite
def small_instance(draw):
    n = draw(st.integers(1, 8))
    k = draw(st.integers(1, min(n, 4)))
    c = draw(st.integers(k, n))
    t = draw(st.integers(0, 14))
    pool = draw(st.integers(k, n))  # fewer experts in play: more reuse, more gaps
    token = st.permutations(range(pool)).map(lambda p: list(p[:k]))
    stream = draw(st.lists(token, min_size=t, max_size=t))
    return np.array(stream, dtype=np.int64).reshape(t, k), n, c


@settings(max_examples=700, deadline=None)
@given(small_instance())
def test_lp_equals_dp_and_greedy(instance):
    stream, n, c = instance
    best = int(exact_insertions(stream[None], n, c)[0])
    check(lp.solve_stream(stream, n, c), best)
    assert greedy_stream(stream, n, c).copies == best  # farthest-future is optimal


def test_lp_equals_dp_on_thousands_of_instances():
    rng = np.random.default_rng(17)
    count = 0
    for n, c, k, t in [(4, 2, 1, 10), (6, 3, 2, 12), (8, 4, 2, 16), (8, 5, 3, 12), (7, 6, 2, 10)]:
        streams = np.concatenate([generate(rng, kind, 200, t, n, k) for kind in KINDS])
        result = lp.solve(streams, n, c)
        assert result.integral and result.certified
        np.testing.assert_array_equal(result.copies, exact_insertions(streams, n, c))
        count += len(streams)
    assert count == 3000


def sweep_shapes():
    shapes = set()
    for path in CONFIGS:
        config = yaml.safe_load(path.read_text())
        shapes |= {tuple(s) for s in config["replay"]["optimum"]["shapes"]}
        tokens = config["replay"]["optimum"]["tokens"]
    return sorted(shapes), tokens


def test_lp_equals_dp_on_every_sweep_shape():
    shapes, tokens = sweep_shapes()
    assert len(shapes) >= 14
    rng = np.random.default_rng(42)
    for n, c, k in shapes:
        for t in tokens:
            streams = np.concatenate([generate(rng, kind, 8, t, n, k) for kind in KINDS])
            result = lp.solve(streams, n, c)
            best = exact_insertions(streams, n, c)
            assert result.integral and result.certified, (n, c, k, t)
            np.testing.assert_array_equal(result.copies, best, err_msg=str((n, c, k, t)))
            distinct = [len(np.unique(s)) for s in streams]
            np.testing.assert_array_equal(result.after_fill, best - np.minimum(c, distinct))


def padded_demand(rng, streams, tokens, n, k):
    """Streams of different lengths, PAD after each one's end, as a trace gives them."""
    requests = np.concatenate([generate(rng, kind, streams, tokens, n, k) for kind in KINDS])
    lengths = rng.integers(tokens // 2, tokens + 1, size=len(requests))
    for s, length in enumerate(lengths):
        requests[s, length:] = PAD
    names = [f"s{i}" for i in range(len(requests))]
    return Demand(names, names, requests, lengths, n)


@pytest.mark.parametrize(("n", "c", "k"), [(16, 4, 2), (16, 8, 4), (32, 12, 4), (64, 32, 8)])
def test_lp_equals_farthest_future_at_unit_cost(n, c, k):
    """Larger instances than the DP reaches: the LP, the project's FarthestFuture policy
    (replayed, steady copies) and lp's farthest-future scan all agree."""
    demand = padded_demand(np.random.default_rng(n * c + k), 3, 120, n, k)
    result = lp.solve(demand.requests, n, c)
    assert result.integral and result.certified
    np.testing.assert_array_equal(result.after_fill, farthest_future(demand, c))
    scan = [g.copies for g in greedy(demand.requests, n, c)]
    np.testing.assert_array_equal(result.copies, scan)


def test_padding_is_the_end_of_a_stream():
    rng = np.random.default_rng(3)
    stream = generate(rng, "bursty", 1, 30, 10, 3)[0]
    padded = np.concatenate([stream, np.full((7, 3), PAD)])
    assert lp.solve_stream(padded, 10, 4).cost == lp.solve_stream(stream, 10, 4).cost
    assert lp.solve_stream(np.full((5, 3), PAD), 10, 4).copies == 0
    assert lp.solve_stream(np.zeros((0, 3), dtype=np.int64), 10, 4).copies == 0


def realize(stream, n, c, gaps):
    """The lazy schedule of a set of bridged gaps: R_t = S_t plus the experts of the bridged
    gaps spanning t. Checks it is lossless and within capacity; returns its insertions."""
    resident, insertions = set(), 0
    for t, token in enumerate(stream):
        held = {int(e) for e, a, b in gaps if a < t < b}
        now = {int(e) for e in token} | held
        assert len(now) <= c
        insertions += len(now - resident)
        resident = now
    return insertions


def test_bridged_gaps_are_a_schedule_of_that_cost():
    rng = np.random.default_rng(5)
    for kind in KINDS:
        for stream in generate(rng, kind, 4, 40, 12, 3):
            result = lp.solve_stream(stream, 12, 5, return_gaps=True)
            assert len(result.bridged_gaps) == result.bridged
            assert realize(stream, 12, 5, result.bridged_gaps) == result.copies


def weighted_dp(stream, n, c, costs):
    """The least-cost lossless schedule, prefetching allowed, by DP over all resident sets:
    moving from R to R' costs the sum of costs over R' minus R."""
    sets = np.arange(1 << n)
    bits = (sets[:, None] >> np.arange(n)) & 1  # [2^N, N]
    inserted = bits[None, :, :] & (1 - bits[:, None, :])  # [R, R', N]: in R' but not R
    move = inserted @ np.asarray(costs, dtype=np.float64)  # [R, R']
    ok_size = bits.sum(axis=1) <= c
    dp = np.where(sets == 0, 0.0, np.inf)
    for token in stream:
        need = sum(1 << int(e) for e in token)
        dp = (dp[:, None] + move).min(axis=0)
        dp[~ok_size | ((sets & need) != need)] = np.inf
    return float(dp.min())


def test_weighted_lp_equals_weighted_dp():
    rng = np.random.default_rng(11)
    for n, c, k in [(4, 2, 1), (5, 3, 2), (6, 3, 1), (6, 4, 2)]:
        for kind in KINDS:
            for stream in generate(rng, kind, 6, 12, n, k):
                costs = rng.choice([0.25, 0.5, 1.0, 2.0], size=n)
                result = lp.solve_stream(stream, n, c, costs=costs)
                assert result.integral and result.certified
                assert result.cost == pytest.approx(weighted_dp(stream, n, c, costs))
                for rule in RULES:
                    assert greedy_stream(stream, n, c, costs, rule).cost >= result.cost - 1e-9


def test_non_unit_costs_greedy_is_not_optimal():
    """C = 2, one expert per token, A costs 10 and B, X cost 1: A B X B A. At X one of A, B
    must go; farthest-future drops A (used again last) and pays 10 to reload it, the LP
    drops B and pays 1."""
    a, b, x = 0, 1, 2
    stream = np.array([[a], [b], [x], [b], [a]])
    costs = [10.0, 1.0, 1.0]
    result = lp.solve_stream(stream, 3, 2, costs=costs, return_gaps=True)
    assert result.cost == 13.0 and result.integral and result.certified
    assert result.bridged_gaps.tolist() == [[a, 0, 4]]
    assert greedy_stream(stream, 3, 2, costs).cost == 22.0  # 10 + 1 + 1 + 10
    assert greedy_stream(stream, 3, 2, costs, "cheapest").cost == 13.0
    # With equal costs the two choices tie and farthest-future is optimal again.
    assert (
        greedy_stream(stream, 3, 2, [3.0] * 3).cost == lp.solve_stream(stream, 3, 2, [3.0] * 3).cost
    )


def test_benchmark_runs():
    report = lp.benchmark(num_experts=16, capacity=8, top_k=4, tokens=60, streams=2)
    assert report["integral"] and report["certified"]
    assert report["optimum"] == report["farthest_future"]
    assert report["lp_seconds"] > 0


@pytest.mark.parametrize(
    ("requests", "n", "c", "message"),
    [
        ([[0, 1]], 4, 1, "lp: top-k 2 is larger than capacity 1"),
        ([[0, 4]], 4, 2, "token 0 requests expert 4, outside 0..3"),
        ([[0, 1], [2, -3]], 4, 2, "token 1 requests expert -3"),
        ([[0, 1], [-1, -1], [2, 3]], 4, 2, "token 1 requests expert -1"),
        ([[0, 1], [2, 2]], 4, 2, "token 1 requests an expert twice"),
        ([0, 1], 4, 2, "requests must be [tokens, k]"),
        ([[0.5]], 4, 2, "expert ids must be integers"),
    ],
)
def test_errors(requests, n, c, message):
    with pytest.raises(MoecacheError) as error:
        lp.solve_stream(np.array(requests), n, c)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_errors_of_costs_rules_and_batches():
    stream = np.array([[0], [1]])
    with pytest.raises(MoecacheError, match="one per expert"):
        lp.solve_stream(stream, 2, 1, costs=[1.0])
    with pytest.raises(MoecacheError, match="non-negative"):
        lp.solve_stream(stream, 2, 1, costs=[1.0, -1.0])
    with pytest.raises(MoecacheError, match="stream 1: lp: token 0 requests expert 9"):
        lp.solve(np.array([[[0]], [[9]]]), 2, 1)
    with pytest.raises(MoecacheError, match=r"\[streams, T, k\]"):
        lp.solve(stream, 2, 1)


def test_mixed_precision_on_a_trace_shaped_demand():
    """The bound job's non-unit-cost experiment: per layer one draw of cheap experts, shared
    by its sequences; the LP never above a greedy; at cost 1 farthest-future is optimal."""
    rng = np.random.default_rng(8)
    requests = np.concatenate([generate(rng, "bursty", 3, 40, 16, 4) for _ in range(2)])
    names = [f"layer{layer}/seq{seq}" for layer in (0, 1) for seq in range(3)]
    demand = Demand(names, [n.split("/")[1] for n in names], requests, np.full(6, 40), 16)
    costs = bound.mixed_costs(demand, 0.5, 0.25, seed=4)
    assert ((costs == 0.25).sum(axis=1) == 8).all() and set(costs.ravel()) == {0.25, 1.0}
    assert (costs[:3] == costs[0]).all() and (costs[3:] == costs[3]).all()
    assert (costs[0] != costs[3]).any()  # layers draw their own
    np.testing.assert_array_equal(costs, bound.mixed_costs(demand, 0.5, 0.25, seed=4))
    mixed = bound.mixed_precision(demand, 8, 0.5, 0.25, seed=4)
    t = mixed["totals"]
    assert t["integral"] and t["certified"] and t["lp"] <= min(t["farthest_future"], t["cheapest"])
    assert t["farthest_future_gap"] == pytest.approx((t["farthest_future"] - t["lp"]) / t["lp"])
    unit = bound.mixed_precision(demand, 8, 0.5, 1.0, seed=4)
    # At cost 1 the reload cost is the copies after each expert's first load.
    assert unit["totals"]["farthest_future"] == unit["totals"]["lp"]
    assert unit["totals"]["farthest_future_optimal_share"] == 1.0
    assert unit["totals"]["lp"] == sum(
        bound.exact(demand, 8) + np.minimum(8, demand.distinct) - demand.distinct
    )


def test_bound_report_has_the_lp_beside_the_bounds():
    demand = padded_demand(np.random.default_rng(2), 2, 50, 20, 4)
    report = bound.report(demand, 9)
    t = report["totals"]
    assert t["b_flat"] <= t["b_star"] <= t["b_greedy"]
    assert t["greedy_optimal"] and t["greedy_minus_b_star"] == 0 and t["greedy_gap"] == 0.0
    assert t["integral"] and t["certified"] and report["mixed_precision"] is None
    assert [s["b_star"] for s in report["streams"]] == bound.exact(demand, 9).tolist()


@st.composite
def priced_demand(draw):
    """A few streams of uneven length (PAD after each end) over one layer or two, each
    layer with its own reload cost per expert (zero included)."""
    n = draw(st.integers(2, 9))
    k = draw(st.integers(1, min(n, 3)))
    c = draw(st.integers(k, n))
    pool = draw(st.integers(k, n))  # fewer experts in play: more reuse, more gaps
    token = st.permutations(range(pool)).map(lambda p: list(p[:k]))
    streams = draw(st.lists(st.lists(token, min_size=1, max_size=25), min_size=1, max_size=4))
    price = st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0])
    layers = [draw(st.lists(price, min_size=n, max_size=n)) for _ in range(2)]
    layer = [draw(st.integers(0, 1)) for _ in streams]
    requests = np.full((len(streams), max(map(len, streams)), k), PAD, dtype=np.int64)
    for i, stream in enumerate(streams):
        requests[i, : len(stream)] = stream
    names = [f"layer{layer[i]}/seq{i}" for i in range(len(streams))]
    lengths = np.array([len(x) for x in streams])
    costs = np.array([layers[i] for i in layer])
    return Demand(names, names, requests, lengths, n), c, costs


@settings(max_examples=300, deadline=None)
@given(priced_demand())
def test_farthest_future_with_costs_equals_the_scan(case):
    """The mixed-precision column's two rules, FarthestFuture replayed without and with
    the reload costs, pay what the gap scan of farthest-future and cheapest-first pays."""
    demand, c, costs = case
    for cheapest, rule in ((False, "farthest-future"), (True, "cheapest")):
        replayed = bound.priced_farthest_future(demand, c, costs, cheapest)
        scan = [
            greedy_stream(demand.requests[s], demand.num_experts, c, costs[s], rule).cost
            for s in range(len(costs))
        ]
        np.testing.assert_allclose(replayed, scan, rtol=1e-12, atol=1e-12)


def test_greedy_scan_takes_the_farthest_future_policys_victims():
    """At mixed copy costs the scan's cost is that of the FarthestFuture policy's own
    copies as the harness plans them: the same victims, ties of last use included (request
    order within a token); given the costs, the victims of cheapest-first."""
    from moecache import policies

    rng = np.random.default_rng(3)
    for _ in range(40):
        n, k = int(rng.integers(5, 9)), int(rng.integers(2, 4))
        c = int(rng.integers(k, n))
        stream = [rng.choice(n, k, replace=False).tolist() for _ in range(int(rng.integers(6, 20)))]
        costs = rng.choice([0.5, 1.0], n)
        for rule, params in (("farthest-future", {}), ("cheapest", {"costs": costs.tolist()})):
            policy = policies.make("farthest-future", c, n, k, params)
            policy.reset(stream)
            resident, paid = set(), 0.0
            for t, request in enumerate(stream):
                plan = policy.change(t, request, np.zeros(n, np.float32), frozenset(resident))
                resident = (resident - set(plan.evict)) | set(plan.admit)
                paid += costs[plan.admit].sum()
            assert greedy_stream(np.array(stream), n, c, costs, rule).cost == pytest.approx(paid)


@pytest.mark.parametrize("costs", [[1.0, 2.0], [1.0, 1.0, -1.0], [1.0, float("nan"), 1.0]])
def test_farthest_future_refuses_bad_costs(costs):
    from moecache import policies

    with pytest.raises(MoecacheError) as error:
        policies.make("farthest-future", 2, 3, 1, {"costs": costs})
    assert "farthest-future" in str(error.value) and "\n" not in str(error.value)
