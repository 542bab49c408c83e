"""LFU: evict the resident with the fewest requests since it was inserted, ties to the
least recently used; as libCacheSim's LFU, whose frequency buckets keep their experts in
the order they reached that count (so the tie goes to the oldest last access). Counts
are forgotten on eviction (in-cache LFU).

Per token: hits and insertions are stamped in request order; the victim is the lowest
(count, stamp) among residents the token does not need.
"""

import numpy as np
from numba import njit

from moecache.policies import kernels

RESIDENT = 1


# State: the lists' arrays (kernels.lists), where [streams, N] RESIDENT or 0, stamp [streams, N]
#   last touch; then
#   count: [streams, N] requests since insertion
State = kernels.state_type(__name__, "count")


@njit(inline="always")
def on_hit(s, row, e):
    s.count[row, e] += 1
    kernels.put(s, row, e, RESIDENT)


@njit(inline="always")
def victim(s, row, e, busy):
    found, best = -1, (kernels.FAR, kernels.FAR)
    for x in range(s.where.shape[1]):
        key = (s.count[row, x], s.stamp[row, x])
        if s.where[row, x] == RESIDENT and key < best and not busy[x]:
            found, best = x, key
    return found


@njit(inline="always")
def on_insert(s, row, e):
    s.count[row, e] = 1
    kernels.put(s, row, e, RESIDENT)


kernels.register(State, on_hit, kernels.nothing, victim, kernels.drop, on_insert)


class LFU(kernels.CompiledEventPolicy):
    name = "lfu"
    libcachesim = "LFU"  # the same algorithm there (tests/test_zoo.py)

    def new_state(self, streams):
        count = np.zeros((streams, self.num_experts), dtype=np.int64)
        return State(**kernels.lists(streams, self.num_experts), count=count)
