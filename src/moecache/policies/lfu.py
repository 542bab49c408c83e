"""LFU: evict the resident with the fewest requests since it was inserted, ties to the
least recently used; as libCacheSim's LFU, whose frequency buckets keep their experts in
the order they reached that count (so the tie goes to the oldest last access). Counts
are forgotten on eviction (in-cache LFU).

Per token: hits and insertions are stamped in request order; the victim is the lowest
(count, stamp) among residents the token does not need.
"""

from typing import NamedTuple

import numpy as np
from numba import njit

from moecache.policies.kernels import FAR, CompiledEventPolicy, drop, lists, nothing, put, register

RESIDENT = 1


class State(NamedTuple):
    where: np.ndarray  # [streams, N] RESIDENT or 0
    stamp: np.ndarray  # [streams, N] last touch
    clock: np.ndarray  # [streams]
    held: np.ndarray  # [streams, LISTS] length of each list
    count: np.ndarray  # [streams, N] requests since insertion


@njit(inline="always")
def on_hit(s, row, e):
    s.count[row, e] += 1
    put(s, row, e, RESIDENT)


@njit(inline="always")
def victim(s, row, e, busy):
    found, best = -1, (FAR, FAR)
    for x in range(s.where.shape[1]):
        key = (s.count[row, x], s.stamp[row, x])
        if s.where[row, x] == RESIDENT and key < best and not busy[x]:
            found, best = x, key
    return found


@njit(inline="always")
def on_evict(s, row, e):
    drop(s, row, e)


@njit(inline="always")
def on_insert(s, row, e):
    s.count[row, e] = 1
    put(s, row, e, RESIDENT)


register(State, on_hit, nothing, victim, on_evict, on_insert)


class LFU(CompiledEventPolicy):
    name = "lfu"

    def new_state(self, streams):
        count = np.zeros((streams, self.num_experts), dtype=np.int64)
        return State(**lists(streams, self.num_experts), count=count)
