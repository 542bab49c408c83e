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

from moecache.policies.kernels import CompiledEventPolicy, drop, lists, nothing, put, register

RESIDENT = 1


class State(NamedTuple):
    where: np.ndarray  # [streams, N] RESIDENT or 0
    stamp: np.ndarray  # [streams, N] last touch
    clock: np.ndarray  # [streams]
    held: np.ndarray  # [streams, LISTS] length of each list
    count: np.ndarray  # [streams, N] requests since insertion


@njit
def on_hit(s, row, e):
    s.count[row, e] += 1
    put(s, row, e, RESIDENT)


@njit
def victim(s, row, e, busy):
    where, count, stamp = s.where[row], s.count[row], s.stamp[row]
    found = -1
    for x in range(len(where)):
        if where[x] != RESIDENT or busy[x]:
            continue
        if found < 0 or (count[x], stamp[x]) < (count[found], stamp[found]):
            found = x
    return found


@njit
def on_evict(s, row, e):
    drop(s, row, e)


@njit
def on_insert(s, row, e):
    s.count[row, e] = 1
    put(s, row, e, RESIDENT)


register(State, on_hit, nothing, victim, on_evict, on_insert)


class LFU(CompiledEventPolicy):
    name = "lfu"

    def new_state(self, streams):
        count = np.zeros((streams, self.num_experts), dtype=np.int64)
        return State(**lists(streams, self.num_experts), count=count)
