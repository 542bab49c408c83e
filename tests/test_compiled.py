"""The compiled zoo (moecache.policies.kernels): replay's one-call path over every stream
counts exactly what stepping the same rule token by token counts (the path the harness and
the libCacheSim tests take), fills and steady copies included, on hypothesis-drawn streams
of uneven length; and an invalid victim is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moecache.errors import MoecacheError
from moecache.policies import ZOO, make
from moecache.policies.kernels import CompiledEventPolicy
from moecache.policies.pools import Pools
from moecache.records.demand import Demand, padded
from moecache.replay import engine


@st.composite
def demands(draw):
    k = draw(st.integers(1, 4))
    experts = draw(st.integers(k + 1, 24))
    capacity = draw(st.integers(k, experts))
    hot = draw(st.integers(k, experts))
    lengths = draw(st.lists(st.integers(1, 60), min_size=1, max_size=5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tokens = [np.array([rng.choice(hot, k, replace=False) for _ in range(n)]) for n in lengths]
    requests, lengths = padded(tokens, k)
    names = [f"s{i}" for i in range(len(tokens))]
    return Demand(names, names, requests, lengths, experts), capacity


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(demands())
def test_one_call_replay_equals_stepping(drawn):
    demand, capacity = drawn
    for rule in ZOO:
        policy = engine.make_rule(rule, demand, capacity)
        assert isinstance(policy, CompiledEventPolicy)
        fast = engine.run(demand, policy)
        stepped = engine.run(demand, engine.make_rule(rule, demand, capacity), keep=True)
        for field in ("insertions", "fills", "steady", "after_fill"):
            assert (getattr(fast, field) == getattr(stepped, field)).all(), (rule, field)
        # Never more residents than slots, every request served (the kept residents).
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
