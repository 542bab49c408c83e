"""SIEVE (Zhang et al., NSDI 2024), as libCacheSim's Sieve: a FIFO queue of residents with a
visited bit (set by a hit, clear on insertion) and a hand that moves from old to new,
wrapping to the oldest. To evict, the hand clears visited bits until it finds a clear
one, evicts that expert and stays where it was, pointing at the next newer one.

Per token: the hand passes over the token's own experts untouched, so none of them is
evicted for another (their visited bit survives).
"""

import numpy as np
from numba import njit

from moecache.policies import kernels

QUEUE = 1


# State: the lists' arrays (kernels.lists), where [streams, N] QUEUE while resident, stamp
#   [streams, N] insertion order; then
#   visited: [streams, N]
#   hand: [streams] the hand is at the oldest resident stamped hand or later
State = kernels.state_type(__name__, "visited", "hand")


@njit(inline="always")
def on_hit(s, row, e):
    s.visited[row, e] = True


@njit(inline="always")
def victim(s, row, e, busy):
    x = kernels.following(s, row, QUEUE, s.hand[row])
    while True:
        if x < 0:  # past the newest: wrap to the oldest
            x = kernels.following(s, row, QUEUE)
        if not busy[x]:
            if not s.visited[row, x]:
                s.hand[row] = s.stamp[row, x]  # after x leaves: the next newer one
                return x
            s.visited[row, x] = False
        x = kernels.following(s, row, QUEUE, s.stamp[row, x] + 1)


@njit(inline="always")
def on_evict(s, row, e):
    kernels.drop(s, row, e)
    if kernels.following(s, row, QUEUE, s.hand[row]) < 0:
        s.hand[row] = 0  # evicted the newest: the hand wraps to the oldest


@njit(inline="always")
def on_insert(s, row, e):
    kernels.put(s, row, e, QUEUE)
    s.visited[row, e] = False


kernels.register(State, on_hit, kernels.nothing, victim, on_evict, on_insert)


class Sieve(kernels.CompiledEventPolicy):
    name = "sieve"
    libcachesim = "Sieve"  # the same algorithm there (tests/test_zoo.py)

    def new_state(self, streams):
        visited = np.zeros((streams, self.num_experts), dtype=np.bool_)
        hand = np.zeros(streams, dtype=np.int64)
        return State(**kernels.lists(streams, self.num_experts), visited=visited, hand=hand)
