"""Cache policies, driven by a small simulator of the pooled block over integer expert ids.

Property tests (hypothesis) check the contract of policy.Policy for every registered rule;
plain examples pin references (Belady/MIN, LRU, exhaustive optimum) and the error messages.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moecache.errors import MoecacheError
from moecache.policies import POLICIES, Policy, PoolChange, make
from moecache.policies.eviction import KEY_LIMIT
from moecache.policies.lru import LRU

# Rules covered in other files, by what they need: a trained file (learned, controller:
# tests/test_learned.py, tests/test_controller.py; next-use: tests/test_next_use.py).
TRAINED = {"learned", "controller", "next-use"}
# The demand a run recorded (oracle-set: tests/test_accuracy.py covers it).
RECORDED = {"oracle-set"}
# Lossless, but only where C == N: lossless_rules adds it there.
WHOLE = "all"
# Parameters worth covering beyond a rule's defaults, by rule name.
PARAMS = {
    "decayed-frequency": [{"decay": 0.5}],
    "co-activation": [{"decay": 0.5, "context_decay": 0.0}],
    "reuse-distance": [{"weight": 1.0, "prior": 2.0, "overdue": 1.0}],
    "farthest-future": [{"foresight": 1}, {"foresight": 3}],
    "clock": [{"bits": 2}],
}
ELSEWHERE = TRAINED | RECORDED | {WHOLE}
# Every registered lossless rule on its defaults, then the parameters above: a new rule is
# covered from the registry alone (the zoo also against libCacheSim: tests/test_zoo.py).
LOSSLESS = [
    (name, {}) for name, cls in POLICIES.items() if not cls.restricts and name not in ELSEWHERE
] + [(name, params) for name, extra in PARAMS.items() for params in extra]
# Every registered restricting rule these tests build; dwell and static also have their
# schedules checked (test_restricting_rules_copy_only_when_scheduled).
RESTRICTING = {name for name, cls in POLICIES.items() if cls.restricts} - ELSEWHERE
# The rules known to restrict the router, pinned so that none changes family unseen.
RESTRICTS = {"dwell", "static", "controller", "oracle-set"}

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- the simulator -----------------------------------------------------------------------


@dataclass
class Step:
    t: int
    request: list[int]
    before: frozenset[int]
    plan: PoolChange
    after: frozenset[int]
    used: list[int]


@dataclass
class Run:
    steps: list[Step] = field(default_factory=list)
    insertions: int = 0
    fills: int = 0
    steady: int = 0

    def plans(self) -> list[tuple[list[int], list[int]]]:
        return [(s.plan.admit, s.plan.evict) for s in self.steps]


def simulate(policy, stream, probs_stream=None) -> Run:
    """Replay `stream` through `policy` as the pooled block does and count the copies.

    Checks what any plan must satisfy (evict only residents, admit only non-residents, each
    once, never above capacity), applies it, and records `used`: the request for a lossless
    rule, else the router's best top-k among the residents (stable over insertion order).
    """
    if probs_stream is None:
        probs_stream = [uniform_probs(policy.num_experts, request) for request in stream]
    policy.reset(future=stream if policy.needs_future else None)
    resident: dict[int, None] = {}  # insertion-ordered, like ExpertPool.slot_of
    been_full = False
    run = Run()
    for t, (request, probs) in enumerate(zip(stream, probs_stream, strict=True)):
        before = frozenset(resident)
        plan = policy.change(t, list(request), probs, before)
        assert isinstance(plan, PoolChange)
        assert len(set(plan.evict)) == len(plan.evict), f"t={t}: evicts twice {plan.evict}"
        assert set(plan.evict) <= before, f"t={t}: evicts non-resident {plan.evict}"
        assert len(set(plan.admit)) == len(plan.admit), f"t={t}: admits twice {plan.admit}"
        assert not set(plan.admit) & before, f"t={t}: admits resident {plan.admit}"
        for e in plan.evict:
            del resident[e]
        for e in plan.admit:
            assert 0 <= e < policy.num_experts
            resident[e] = None
        assert len(resident) <= policy.capacity, f"t={t}: {len(resident)} > capacity"
        if plan.admit:
            run.insertions += len(plan.admit)
            if been_full:
                run.steady += len(plan.admit)
            else:
                run.fills += len(plan.admit)
                been_full = len(resident) == policy.capacity
        if policy.restricts:
            ids = np.fromiter(resident, dtype=np.int64)
            used = ids[np.argsort(-probs[ids], kind="stable")[: policy.top_k]].tolist()
        else:
            used = list(request)
        run.steps.append(Step(t, list(request), before, plan, frozenset(resident), used))
    return run


def uniform_probs(num_experts: int, request) -> np.ndarray:
    """A probability vector whose strict top-k, in order, is `request`."""
    probs = np.full(num_experts, 1.0)
    probs[list(request)] = np.arange(len(request) + 1, 1, -1, dtype=float)
    return probs / probs.sum()


def router_probs(num_experts: int, stream, seed: int) -> list[np.ndarray]:
    """Random softmax outputs, one per token, whose top-k in order is that token's request."""
    rng = np.random.default_rng(seed)
    out = []
    for request in stream:
        values = np.sort(rng.dirichlet(np.ones(num_experts)))[::-1]
        probs = np.empty(num_experts)
        probs[list(request)] = values[: len(request)]
        others = np.array([e for e in range(num_experts) if e not in request], dtype=np.int64)
        probs[rng.permutation(others)] = values[len(request) :]
        out.append(probs)
    return out


# --- references --------------------------------------------------------------------------


def belady_reference(stream: list[int], capacity: int) -> int:
    """Classical MIN on single requests: on a miss with a full cache, evict the resident
    whose next use is farthest (never used again counts as farthest)."""
    cache: set[int] = set()
    misses = 0
    for t, e in enumerate(stream):
        if e in cache:
            continue
        misses += 1
        if len(cache) == capacity:

            def next_use(x, t=t):
                rest = stream[t + 1 :]
                return rest.index(x) if x in rest else len(stream)

            cache.remove(max(cache, key=next_use))
        cache.add(e)
    return misses


def lru_reference(stream: list[int], capacity: int) -> int:
    """Textbook LRU on single requests with an OrderedDict (most recent at the end)."""
    cache: OrderedDict[int, None] = OrderedDict()
    misses = 0
    for e in stream:
        if e in cache:
            cache.move_to_end(e)
            continue
        misses += 1
        if len(cache) == capacity:
            cache.popitem(last=False)
        cache[e] = None
    return misses


def optimum_reference(stream, capacity: int) -> int:
    """Fewest copies any lossless demand rule can make: exhaustive search over every choice
    of victims at every token (feasible for a handful of experts)."""
    best = {frozenset(): 0}
    for request in stream:
        need = set(request)
        nxt: dict[frozenset, int] = {}
        for cache, cost in best.items():
            misses = need - cache
            surplus = len(misses) - (capacity - len(cache))
            options = sorted(cache - need)
            for victims in itertools.combinations(options, max(0, surplus)):
                state = (cache - set(victims)) | misses
                nxt[state] = min(nxt.get(state, cost + len(misses)), cost + len(misses))
        best = nxt
    return min(best.values())


def warm_start_copies(stream, capacity: int) -> int:
    """Fill copies of a lossless rule: the pool only grows until the first token whose
    distinct demand so far reaches capacity, and that token's whole group still fills."""
    seen: set[int] = set()
    for request in stream:
        seen.update(request)
        if len(seen) >= capacity:
            break
    return len(seen)


def dwell_target(stream, t: int, window: int, capacity: int) -> list[int]:
    """The experts most requested in tokens t-window+1..t, ties to the more recently
    requested, then the lower id; at most `capacity`."""
    counts: dict[int, int] = {}
    last: dict[int, int] = {}
    for s in range(max(0, t - window + 1), t + 1):
        for e in stream[s]:
            counts[e] = counts.get(e, 0) + 1
            last[e] = s
    return sorted(counts, key=lambda e: (-counts[e], -last[e], e))[:capacity]


# --- strategies --------------------------------------------------------------------------


@dataclass
class Case:
    num_experts: int
    capacity: int
    top_k: int
    stream: list[list[int]]
    seed: int

    def probs(self) -> list[np.ndarray]:
        return router_probs(self.num_experts, self.stream, self.seed)


@st.composite
def cases(draw, top_k=(1, 4), max_experts=24, max_len=60) -> Case:
    """A layer shape and a demand stream; ids come from a drawn hot set so hits happen."""
    k = draw(st.integers(*top_k))
    n = draw(st.integers(max(4, k), max_experts))
    capacity = draw(st.integers(k, n))
    hot = draw(st.integers(k, n))
    names = draw(st.permutations(range(n)))
    ids = st.sampled_from(names[:hot])
    request = st.lists(ids, min_size=k, max_size=k, unique=True)
    stream = draw(st.lists(request, min_size=1, max_size=max_len))
    return Case(n, capacity, k, stream, draw(st.integers(0, 2**32 - 1)))


def lossless_rules(case: Case):
    rules = list(LOSSLESS)
    if case.capacity == case.num_experts:
        rules.append((WHOLE, {}))
    return rules


def build(case: Case, name: str, params: dict):
    return make(name, case.capacity, case.num_experts, case.top_k, dict(params))


def label(name: str, params: dict) -> str:
    return name + "".join(f" {k}={v}" for k, v in params.items())


# --- 1. the lossless contract ------------------------------------------------------------


@SETTINGS
@given(cases())
def test_lossless_rules_copy_exactly_the_misses(case):
    """Every lossless rule serves each request from the pool, admits exactly the requested
    experts that were missing (no prefetch), and evicts non-requested residents only when
    there is no free slot; "all" instead fills the pool at token 0 and then never copies."""
    probs = case.probs()
    for name, params in lossless_rules(case):
        run = simulate(build(case, name, params), case.stream, probs)
        for step in run.steps:
            request, before, plan = set(step.request), step.before, step.plan
            assert request <= step.after, (label(name, params), step)
            assert not set(plan.evict) & request, (label(name, params), step)
            if name == "all":
                expected = set(range(case.num_experts)) if step.t == 0 else set()
                assert set(plan.admit) == expected and not plan.evict
                continue
            assert sorted(plan.admit) == sorted(request - before), (label(name, params), step)
            room = case.capacity - len(before)
            assert len(plan.evict) == max(0, len(plan.admit) - room), (label(name, params), step)
        assert run.fills + run.steady == run.insertions
        if name == "all":
            assert (run.fills, run.steady) == (case.num_experts, 0)
        else:
            assert run.fills == warm_start_copies(case.stream, case.capacity), label(name, params)


def test_every_registered_policy_is_covered():
    """The tests here run every rule in POLICIES (the lossless ones through LOSSLESS, the
    restricting ones through RESTRICTING) but those another file covers (ELSEWHERE), and
    the rules known to restrict the router still do, the pinned lossless ones not."""
    covered = {name for name, _ in LOSSLESS} | RESTRICTING | ELSEWHERE
    assert covered == set(POLICIES)
    assert {name for name, cls in POLICIES.items() if cls.restricts} >= RESTRICTS
    assert not any(POLICIES[name].restricts for name in (WHOLE, "learned", "next-use", *PARAMS))


# --- 2. determinism ----------------------------------------------------------------------


@SETTINGS
@given(cases(), st.integers(1, 8), st.integers(1, 8))
def test_runs_are_deterministic(case, k, window):
    """Two fresh policies give the same plans and counts on the same stream, and so does one
    policy reset and replayed (reset forgets the previous sequence)."""
    probs = case.probs()
    rules = lossless_rules(case) + [("dwell", {"k": k, "window": window})]
    rules.append(("static", {"window": window}))
    rules += [(name, {}) for name in sorted(RESTRICTING - {"dwell", "static"})]
    for name, params in rules:
        first = simulate(build(case, name, params), case.stream, probs)
        policy = build(case, name, params)
        second = simulate(policy, case.stream, probs)
        simulate(policy, case.stream[::-1], probs[::-1])
        third = simulate(policy, case.stream, probs)
        for other in (second, third):
            assert other.plans() == first.plans(), label(name, params)
            assert [s.used for s in other.steps] == [s.used for s in first.steps]
            counts = (other.insertions, other.fills, other.steady)
            assert counts == (first.insertions, first.fills, first.steady)


# --- 3. farthest future is optimal -------------------------------------------------------


@SETTINGS
@given(cases())
def test_farthest_future_never_copies_more(case):
    """Unlimited farthest future makes no more copies than any other lossless rule, LRU
    included, and with foresight >= the stream length it is the unlimited rule."""
    probs = case.probs()
    best = simulate(build(case, "farthest-future", {}), case.stream, probs)
    for name, params in lossless_rules(case):
        run = simulate(build(case, name, params), case.stream, probs)
        assert best.insertions <= run.insertions, (label(name, params), run.insertions)
    for foresight in (len(case.stream), len(case.stream) + 5):
        limited = simulate(
            build(case, "farthest-future", {"foresight": foresight}), case.stream, probs
        )
        assert limited.insertions == best.insertions
        assert limited.plans() == best.plans()


@settings(max_examples=40, deadline=None)
@given(cases(max_experts=7, max_len=30))
def test_farthest_future_matches_exhaustive_optimum(case):
    """With several requests per token too, farthest future reaches the fewest copies any
    choice of victims could (exhaustive search over small pools)."""
    run = simulate(build(case, "farthest-future", {}), case.stream, case.probs())
    assert run.insertions == optimum_reference(case.stream, case.capacity)


@pytest.mark.parametrize("foresight", [0, -1, -10])
def test_foresight_below_one_is_rejected(foresight):
    """Foresight must be at least one token."""
    with pytest.raises(MoecacheError, match="foresight"):
        make("farthest-future", 4, 8, 2, {"foresight": foresight})


def test_limited_foresight_falls_back_to_lru():
    """Foresight 1 sees only the next token: residents not needed then are equal, and the
    least recently used of them goes (here 0, though 1 is never used again)."""
    stream = [[0], [1], [2], [3], [0]]
    run = simulate(make("farthest-future", 2, 4, 1, {"foresight": 1}), stream)
    assert run.steps[2].plan.evict == [0]
    full = simulate(make("farthest-future", 2, 4, 1, {}), stream)
    assert full.steps[2].plan.evict == [1]
    assert (run.insertions, full.insertions) == (5, 4)


# --- 4. single requests: Belady/MIN and LRU references -----------------------------------


@SETTINGS
@given(cases(top_k=(1, 1)))
def test_single_requests_match_references(case):
    """With one request per token farthest future counts exactly as classical MIN and LRU
    exactly as a textbook LRU."""
    singles = [request[0] for request in case.stream]
    probs = case.probs()
    ff = simulate(build(case, "farthest-future", {}), case.stream, probs)
    assert ff.insertions == belady_reference(singles, case.capacity)
    lru = simulate(build(case, "lru", {}), case.stream, probs)
    assert lru.insertions == lru_reference(singles, case.capacity)


def test_belady_example():
    """A textbook stream: MIN with three frames takes 7 misses where LRU takes 9."""
    singles = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2]
    stream = [[e] for e in singles]
    ff = simulate(make("farthest-future", 3, 8, 1, {}), stream)
    lru = simulate(make("lru", 3, 8, 1, {}), stream)
    assert ff.insertions == belady_reference(singles, 3) == 7
    assert lru.insertions == lru_reference(singles, 3) == 9
    assert (ff.fills, ff.steady) == (3, 4)


# --- 5. restricting rules ----------------------------------------------------------------


@SETTINGS
@given(cases())
def test_dwell_one_one_is_lossless(case):
    """Dwell with k=1 and window=1 refreshes to the current request at every token, so the
    block computes exactly what the router asked for."""
    run = simulate(build(case, "dwell", {"k": 1, "window": 1}), case.stream, case.probs())
    for step in run.steps:
        assert set(step.used) == set(step.request), step


def scheduled(name: str, t: int, k: int, window: int) -> bool:
    if name == "static":
        return t < window
    return t < window or (t - (window - 1)) % k == 0


@SETTINGS
@given(cases(), st.sampled_from(["dwell", "static"]), st.integers(1, 8), st.integers(1, 70))
def test_restricting_rules_copy_only_when_scheduled(case, name, k, window):
    """Dwell(k, window) changes the pool only at every token of the warm start and then every
    k tokens; static only in its first `window` tokens. After a refresh the pool holds the
    window's most requested experts, and the block always uses top-k resident experts."""
    params = {"k": k, "window": window} if name == "dwell" else {"window": window}
    run = simulate(build(case, name, params), case.stream, case.probs())
    for step in run.steps:
        plan = step.plan
        if plan.admit or plan.evict:
            assert scheduled(name, step.t, k, window), (label(name, params), step)
        if scheduled(name, step.t, k, window):
            target = dwell_target(case.stream, step.t, window, case.capacity)
            assert set(target) <= step.after, (label(name, params), step, target)
        assert len(step.used) == case.top_k == len(set(step.used))
        assert set(step.used) <= step.after
    assert run.fills + run.steady == run.insertions
    full = [s.t for s in run.steps if len(s.after) == case.capacity]
    steady = [len(s.plan.admit) for s in run.steps if full and s.t > full[0]]
    assert run.steady == sum(steady)


def test_static_freezes_after_its_window():
    """Static(window=2) fills from the first two tokens' demand, then never copies."""
    stream = [[0, 1], [1, 2], [3, 4], [3, 4], [5, 6]]
    run = simulate(make("static", 3, 8, 2, {"window": 2}), stream)
    assert run.steps[-1].after == {0, 1, 2}
    assert all(not s.plan.admit and not s.plan.evict for s in run.steps[2:])
    assert run.steps[2].used == [0, 1]  # the router's best residents, 3 and 4 being absent
    assert (run.insertions, run.fills, run.steady) == (3, 3, 0)


# --- 6. errors ---------------------------------------------------------------------------


def one_line(caught) -> str:
    message = str(caught.value)
    assert message and "\n" not in message
    return message


def test_unknown_policy_is_named():
    """An unknown rule name is one line that names it."""
    with pytest.raises(MoecacheError) as caught:
        make("clairvoyant", 4, 8, 2, {})
    assert "clairvoyant" in one_line(caught)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_unknown_parameter_is_named(name):
    """An unknown keyword is one line that names it, for every rule."""
    capacity = 8 if name == "all" else 4
    with pytest.raises(MoecacheError) as caught:
        make(name, capacity, 8, 2, {"bogus_knob": 3})
    assert "bogus_knob" in one_line(caught)


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize(("capacity", "num_experts", "top_k"), [(9, 8, 2), (2, 8, 3), (4, 8, 0)])
def test_impossible_shapes_are_refused(name, capacity, num_experts, top_k):
    """Capacity above the expert count, or top-k above capacity (or zero), is refused."""
    with pytest.raises(MoecacheError) as caught:
        make(name, capacity, num_experts, top_k, {})
    one_line(caught)


def test_all_needs_capacity_equal_to_experts():
    """ "all" keeps every expert resident, so its capacity must be the expert count."""
    with pytest.raises(MoecacheError) as caught:
        make("all", 4, 8, 2, {})
    assert "capacity" in one_line(caught)
    make("all", 8, 8, 2, {})


def test_farthest_future_needs_the_recorded_demand():
    """Farthest future refuses to start without the demand of an earlier run."""
    policy = make("farthest-future", 2, 4, 1, {})
    with pytest.raises(MoecacheError) as caught:
        policy.reset()
    assert "farthest-future" in one_line(caught)


@pytest.mark.parametrize(("t", "wrong"), [(1, [2, 0]), (0, [0, 2]), (3, [0, 1])])
def test_farthest_future_refuses_a_different_demand(t, wrong):
    """A request that differs from the recorded one at token t (or a token past its end)
    stops the run with one line; the same experts in another order are accepted."""
    future = [[0, 1], [1, 2], [2, 3]]
    policy = make("farthest-future", 3, 4, 2, {})
    policy.reset(future=future)
    for s in range(t):
        if s < len(future):
            policy.change(s, future[s], uniform_probs(4, future[s]), frozenset())
    with pytest.raises(MoecacheError) as caught:
        policy.change(t, wrong, uniform_probs(4, wrong), frozenset())
    assert f"token {t}" in one_line(caught)
    policy.reset(future=future)
    assert policy.change(0, [1, 0], uniform_probs(4, [1, 0]), frozenset()).admit == [1, 0]


class Shifted(LRU):
    """LRU with every key moved by `shift`: the same order, any key range."""

    name = "shifted-lru"

    def __init__(self, capacity, num_experts, top_k, shift: int = 0):
        super().__init__(capacity, num_experts, top_k)
        self.shift = shift

    def priority(self, t, rows, probs):
        return self.recency[rows] + self.shift


@pytest.mark.parametrize(("shift", "refused"), [(KEY_LIMIT - 8, False), (2**61, True), (-1, True)])
def test_priority_keys_are_checked_below_2_40(shift, refused):
    """Keys are folded as key * N + id in int64: a key from 2**40 (at 2**61 the fold wraps
    negative and would pick a wrong victim) or below 0 stops the run with one line naming
    the rule and the token; keys just below the bound still give LRU's victims. Here every
    key is an LRU key (at most 5) plus `shift`; the first eviction is at token 2."""
    stream = [[0], [1], [2], [0], [3]]
    policy = Shifted(2, 4, 1, shift=shift)
    if not refused:
        assert (
            simulate(policy, stream).plans() == simulate(make("lru", 2, 4, 1, {}), stream).plans()
        )
        return
    with pytest.raises(MoecacheError) as caught:
        simulate(policy, stream)
    assert "shifted-lru" in one_line(caught) and "token 2" in one_line(caught)


@pytest.mark.parametrize("name", sorted(RESTRICTING | RECORDED))
def test_restricting_rules_serve_one_stream(name):
    """reset(future, streams) is one signature for every rule; a rule that serves the
    harness's one stream refuses many in one line."""
    policy = make(name, 2, 4, 1, {})
    with pytest.raises(MoecacheError) as caught:
        policy.reset([[0], [1]], streams=3)
    assert name in one_line(caught) and "3" in one_line(caught)


def test_mean_interval_readings_part_on_a_burst():
    """Expert 0 comes in a burst (tokens 0 and 1, mean interval 1), expert 1 once (token 2),
    then 2 needs room. Today's reading counts the once-seen 1 as never returning and evicts
    it; the literal one gives it no interval (next use = its last use, token 2), ties it with
    the burst's forecast 1 + 1 and evicts the less recent 0. So 1 returning at token 4 hits
    only under the literal reading, and 0 returning only under today's."""
    for back, copies in (
        (1, {"mean-interval": 4, "mean-interval-literal": 3}),
        (0, {"mean-interval": 3, "mean-interval-literal": 4}),
    ):
        stream = [[0], [0], [1], [2], [back]]
        runs = {name: simulate(make(name, 2, 4, 1, {}), stream) for name in copies}
        assert runs["mean-interval"].steps[3].plan.evict == [1]
        assert runs["mean-interval-literal"].steps[3].plan.evict == [0]
        assert {name: run.insertions for name, run in runs.items()} == copies


@pytest.mark.parametrize("name", sorted(set(POLICIES) - TRAINED))
def test_every_rule_starts_through_the_one_reset(name, monkeypatch):
    """Policy.reset is the one reset: every rule family (EvictionPolicy, EventPolicy and the
    compiled ones, ScheduledPolicy) extends it through super().reset, and no reset on the
    way from the rule to Policy is skipped (CompiledEventPolicy skipped EventPolicy's)."""
    cls = POLICIES[name]
    defining = [c for c in cls.__mro__ if "reset" in vars(c)]
    assert defining[-1] is Policy
    calls = []

    def spy(c, reset):
        def spied(self, future=None, streams=1):
            calls.append(c)
            reset(self, future, streams)

        return spied

    for c in defining:
        monkeypatch.setattr(c, "reset", spy(c, vars(c)["reset"]))
    policy = make(name, 4, 4, 1, {})
    policy.reset([[0], [1], [2]] if policy.needs_future else None)
    assert calls == defining, name


def test_compiled_rules_leave_numbas_global_config_alone():
    """kernels.py caches its drivers per function (kernels.compiled), not by setting
    numba.config at import."""
    import subprocess
    import sys

    code = (
        "import numba; before = numba.config.CACHE_DIR; "
        "import moecache.policies, moecache.replay.engine; "
        "assert numba.config.CACHE_DIR == before, numba.config.CACHE_DIR"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
