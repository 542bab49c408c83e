"""The zoo of classic eviction rules (fifo ... w-tinylfu), run per token through EventPolicy.

(a) At one expert per token each rule's misses equal libCacheSim's for the same algorithm
and capacity, on libCacheSim's defaults, where libCacheSim's own sizing lets the two agree
(stated per rule in RANGE); LIRS and W-TinyLFU depart from libCacheSim by construction
(see their module docstrings) and are held to a stated margin. (b) The lossless invariants
hold for every zoo rule at k > 1; (c) the harness path (`plan`, one stream) and replay's
batched `step` (many streams at once) agree; (d) runs are deterministic; (e) replay's
compiled one-call path counts what stepping counts; an invalid victim is one line.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import libcachesim
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moecache.errors import MoecacheError
from moecache.policies import POLICIES, ZOO, EventPolicy, make
from moecache.policies.kernels import CompiledEventPolicy
from moecache.policies.pools import Pools


def replay_modules():
    """The replay engine and Demand, under their names after or before the package move."""
    try:
        from moecache.records import demand
        from moecache.replay import engine
    except ImportError:
        from moecache import demand
        from moecache import replay as engine
    return engine, demand


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Capacities at which libCacheSim's defaults let it agree exactly, where not every C from 1
# (ANY): its SLRU gives each of 4 segments C // 4 (the rest unused), its 2Q admits nothing
# while A1in rounds to 0 slots (C < 4), its S3-FIFO nothing new while its small FIFO has
# fewer than 2 (C < 20). Every zoo rule (policies.ZOO) not in MARGIN is held to equality.
ANY = range(1, 40)
EXACT = {"slru": range(4, 64, 4), "two-q": range(4, 40), "s3-fifo": range(20, 60)}
# Stated margins, misses apart per request, with the capacities libCacheSim can run:
# LIRS - libCacheSim's LIRS evicts on some hits and demotes two LIR blocks on a miss
# found in its stack (not the paper's algorithm), and breaks down below C = 10;
# W-TinyLFU - libCacheSim's counting Bloom filter (hash collisions) and its eviction
# loop that can evict twice per miss; its 1% window is empty below C = 100.
MARGIN = {"lirs": (range(10, 60), 0.05), "w-tinylfu": (range(100, 160), 0.02)}
# The zoo rules written compiled (kernels.py), which replay runs in one call.
COMPILED = [rule for rule in ZOO if issubclass(POLICIES[rule], CompiledEventPolicy)]


# --- libCacheSim on one expert per token ------------------------------------------------

RECORD = np.dtype([("time", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])


def libcachesim_misses(stream: list[int], capacity: int, rule: str) -> int:
    """libCacheSim's misses on `stream`, read from an oracleGeneral file (objects of size
    1, so cache_size counts objects; ids shifted by one: 0 is not a valid id)."""
    keys = np.asarray(stream, dtype=np.int64) + 1
    records = np.zeros(len(keys), dtype=RECORD)
    records["time"], records["id"], records["size"] = np.arange(len(keys)), keys, 1
    order = np.lexsort((np.arange(len(keys)), keys))
    nxt = np.full(len(keys), -1, dtype=np.int64)
    same = keys[order[1:]] == keys[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    records["next"] = nxt
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "stream.oracleGeneral.bin"
        records.tofile(path)
        reader = libcachesim.TraceReader(str(path), libcachesim.TraceType.ORACLE_GENERAL_TRACE)
        cache = getattr(libcachesim, ZOO[rule])(cache_size=capacity, hashpower=12)
        ratio, _ = cache.process_trace(reader)
    return round(ratio * len(keys))


# --- our rules, driven through step ------------------------------------------------------


def drive(policy, streams: np.ndarray, check: bool = False):
    """Run [S, T, k] streams at once through `policy.step` as replay does; returns the
    insertions [S] and the victims of every token [T][S] (sorted expert ids). With `check`
    asserts the lossless invariants after every token."""
    count, steps, k = streams.shape
    n, capacity = policy.num_experts, policy.capacity
    policy.reset(streams=count)
    pools = Pools(count, n, capacity)
    at = streams + (np.arange(count) * n)[:, None, None]
    insertions = np.zeros(count, dtype=np.int64)
    history = []
    for t in range(steps):
        before, held = pools.resident.copy(), pools.count.copy()
        token = policy.step(t, at[:, t], None, pools)
        pools.apply(count, token)
        insertions += token.copies
        victims = [[] for _ in range(count)]
        for flat in token.victims.tolist():
            victims[flat // n].append(flat % n)
        history.append([sorted(v) for v in victims])
        if not check:
            continue
        after = pools.resident
        for s in range(count):
            request = set(streams[s, t].tolist())
            misses = {e for e in request if not before[s, e]}
            assert token.copies[s] == len(misses) == int(token.miss[s].sum())
            assert request <= set(np.flatnonzero(after[s]).tolist())  # all served
            assert not request & set(victims[s])  # never evicts the token's own
            assert set(victims[s]) <= set(np.flatnonzero(before[s]).tolist())
            # Evicts only to make room: the pool grows until full, then stays full.
            assert len(victims[s]) == max(0, held[s] + len(misses) - capacity)
            assert after[s].sum() == pools.count[s] == min(capacity, held[s] + len(misses))
    return insertions, history


def misses(rule: str, stream: list[int], capacity: int, experts: int) -> int:
    policy = make(rule, capacity, experts, 1, {})
    return int(drive(policy, np.asarray(stream)[None, :, None])[0][0])


@st.composite
def single_streams(draw, capacities):
    """A capacity, an expert count and a stream of single requests drawn from a hot set
    (so that hits, ghosts and promotions happen)."""
    capacity = draw(st.sampled_from(list(capacities)))
    experts = draw(st.integers(capacity, 3 * capacity + 4))
    hot = draw(st.integers(1, experts))
    stream = draw(st.lists(st.integers(0, hot - 1), min_size=1, max_size=400))
    return capacity, experts, stream


# --- (a) libCacheSim ---------------------------------------------------------------------


@pytest.mark.parametrize("rule", sorted(set(ZOO) - set(MARGIN)))
def test_single_requests_equal_libcachesim(rule):
    """At one expert per token the rule's misses equal libCacheSim's, exactly."""

    @SETTINGS
    @given(single_streams(EXACT.get(rule, ANY)))
    def check(drawn):
        capacity, experts, stream = drawn
        ours = misses(rule, stream, capacity, experts)
        assert ours == libcachesim_misses(stream, capacity, rule), (rule, capacity)

    check()


@pytest.mark.parametrize("rule", sorted(MARGIN))
def test_single_requests_near_libcachesim(rule):
    """LIRS and W-TinyLFU stay within their stated margin of libCacheSim's misses."""
    capacities, margin = MARGIN[rule]

    @settings(SETTINGS, max_examples=15, derandomize=True)
    @given(single_streams(capacities))
    def check(drawn):
        capacity, experts, stream = drawn
        ours = misses(rule, stream, capacity, experts)
        theirs = libcachesim_misses(stream, capacity, rule)
        assert abs(ours - theirs) <= margin * len(stream) + 2, (rule, ours, theirs)

    check()


def test_zoo_is_registered_with_cli_names():
    """Every zoo rule is an EventPolicy in the registry, under its command-line name; the
    zoo's rules all register, and the per-rule data above names only zoo rules."""
    names = "fifo clock lfu slru two-q arc lirs sieve s3-fifo w-tinylfu".split()
    assert set(names) <= set(ZOO) and set(EXACT) | set(MARGIN) <= set(ZOO)
    assert set(names) <= set(COMPILED)
    for name in ZOO:
        assert issubclass(POLICIES[name], EventPolicy) and POLICIES[name].name == name
        assert not POLICIES[name].restricts and not POLICIES[name].needs_future


def test_examples_by_hand():
    """Textbook cases: CLOCK gives a second chance, SIEVE keeps its hand, LFU breaks ties
    to the least recent, FIFO ignores hits."""
    assert misses("fifo", [0, 1, 0, 2, 0], 2, 4) == 4  # 0 goes at 2 despite its hit
    assert misses("lru", [0, 1, 0, 2, 0], 2, 4) == 3
    assert misses("clock", [0, 1, 0, 2, 0], 2, 4) == 3  # 0's bit saves it
    assert misses("lfu", [0, 0, 1, 2, 1], 2, 4) == 4  # 1 (count 1, older) goes for 2
    assert misses("sieve", [0, 1, 2, 0, 3, 1], 3, 4) == 5


# --- (b)-(d) per-token rules at k > 1, (e) the compiled one-call replay ----------------


@st.composite
def token_streams(draw, min_k=2, even=True):
    """A capacity, an expert count and 1 to 5 streams of tokens of k distinct experts each
    from a hot set: all as long (`even`, as [S, T, k]) or of uneven lengths (a list)."""
    k = draw(st.integers(min_k, 4))
    experts = draw(st.integers(k + 1, 24))
    capacity = draw(st.integers(k, experts))
    hot = draw(st.integers(k, experts))
    if even:
        lengths = [draw(st.integers(1, 40))] * draw(st.integers(1, 3))
    else:
        lengths = draw(st.lists(st.integers(1, 60), min_size=1, max_size=5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    streams = [np.array([rng.choice(hot, k, replace=False) for _ in range(n)]) for n in lengths]
    return capacity, experts, np.array(streams) if even else streams


@pytest.mark.parametrize("rule", ZOO)
@settings(SETTINGS, max_examples=30)
@given(drawn=token_streams())
def test_a_zoo_rule_at_k_above_one(rule, drawn):
    """(b) The lossless invariants: every requested expert is resident after its token,
    victims are residents the token does not need, taken only when the pool is full (so it
    never exceeds capacity, fills and then stays full), and copies are exactly the misses.
    (c) The harness path (plan, one stream, resident set given) and replay's step over all
    streams at once evict the same experts and copy as often, token by token. (d) Runs are
    deterministic: two fresh rules, and one rule reset after another run, give the same
    victims."""
    capacity, experts, streams = drawn
    k = streams.shape[2]
    first = insertions, history = drive(make(rule, capacity, experts, k, {}), streams, check=True)
    for s, stream in enumerate(streams):
        policy = make(rule, capacity, experts, k, {})
        policy.reset()
        resident: set[int] = set()
        copies = 0
        for t, request in enumerate(stream.tolist()):
            plan = policy.change(t, request, np.full(experts, 1 / experts), frozenset(resident))
            assert plan.evict == history[t][s], (rule, s, t)
            resident = (resident - set(plan.evict)) | set(plan.admit)
            copies += len(plan.admit)
        assert copies == insertions[s], rule
    policy = make(rule, capacity, experts, k, {})
    drive(policy, streams[:, ::-1].copy())
    for other in (drive(make(rule, capacity, experts, k, {}), streams), drive(policy, streams)):
        assert other[1] == first[1] and (other[0] == first[0]).all(), rule


@pytest.mark.parametrize("rule", COMPILED)
@settings(SETTINGS, max_examples=25)
@given(drawn=token_streams(min_k=1, even=False))
def test_a_zoo_rule_replayed_in_one_call_counts_what_stepping_counts(rule, drawn):
    """(e) The compiled zoo (moecache.policies.kernels): replay's one-call path over every
    stream counts exactly what stepping the same rule token by token counts (the path the
    harness and the libCacheSim tests take), fills and steady copies included, on streams
    of uneven length; stepped, never more residents than slots, every request served."""
    engine, demand_module = replay_modules()
    capacity, experts, tokens = drawn
    requests, lengths = demand_module.padded(tokens, tokens[0].shape[1])
    names = [f"s{i}" for i in range(len(tokens))]
    demand = demand_module.Demand(names, names, requests, lengths, experts)
    policy = engine.make_rule(rule, demand, capacity)
    assert isinstance(policy, CompiledEventPolicy)
    fast = engine.run(demand, policy)
    stepped = engine.run(demand, engine.make_rule(rule, demand, capacity), keep=True)
    for field in ("insertions", "fills", "steady", "after_fill"):
        assert (getattr(fast, field) == getattr(stepped, field)).all(), (rule, field)
    assert stepped.residents.sum(axis=2).max() <= capacity
    t = np.arange(demand.requests.shape[1])
    for s, n in enumerate(demand.lengths):
        served = stepped.residents[s, t[:n, None], demand.requests[s, :n]]
        assert served.all(), (rule, s)


def test_an_invalid_victim_is_one_line():
    """A pool full of experts the rule never saw inserted: the rule finds no victim, and
    step refuses in one line naming the rule and token instead of evicting anything."""
    policy = make("fifo", 2, 4, 1, {})
    policy.reset(streams=1)
    pools = Pools.holding({0, 1}, 4, 2)
    with pytest.raises(MoecacheError, match="^policy fifo: invalid victim at token 0$"):
        policy.step(0, np.array([[2]]), None, pools)


def test_replay_runs_the_zoo():
    """Replay runs a zoo rule like any lossless rule (per-stream loop inside step), with
    the same insertions as driving step directly."""
    engine, demand_module = replay_modules()
    rng = np.random.default_rng(0)
    requests = np.array([[rng.choice(12, 2, replace=False) for _ in range(30)] for _ in range(4)])
    demand = demand_module.from_arrays(requests, 12)
    assert set(ZOO) <= set(engine.lossless_rules(demand))
    for rule in ZOO:
        counts = engine.run(demand, engine.make_rule(rule, demand, 5))
        direct = drive(make(rule, 5, 12, 2, {}), requests)[0]
        assert (counts.insertions == direct).all(), rule


@pytest.mark.parametrize(
    ("rule", "params"),
    [
        ("clock", {"bits": 0}),
        ("slru", {"segments": 0}),
        ("two-q", {"ain": 1.0}),
        ("s3-fifo", {"small": -0.1}),
        ("w-tinylfu", {"window": 1.0}),
    ],
)
def test_bad_parameters_are_one_line(rule, params):
    """A parameter out of range is refused with one line naming the rule."""
    with pytest.raises(MoecacheError) as caught:
        make(rule, 8, 16, 2, params)
    assert rule in str(caught.value) and "\n" not in str(caught.value)
