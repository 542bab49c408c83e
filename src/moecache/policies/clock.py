"""CLOCK (Corbato 1968), as libCacheSim's Clock: a FIFO queue whose following is the hand; each
expert has an n-bit use counter (`bits`, default 1), 0 on insertion, +1 per hit up to
2**bits - 1. To evict, the hand takes the following: a counter above 0 is decremented and the
expert goes to the head; the first expert found at 0 is evicted.

Per token: the hand passes over the token's own experts untouched (they go to the head
without losing their count), so none of them is evicted for another.
"""

import numpy as np
from numba import njit

from moecache.errors import MoecacheError
from moecache.policies import kernels

QUEUE = 1


# State: the lists' arrays (kernels.lists), where [streams, N] QUEUE while resident, stamp
#   [streams, N] queue order, the hand at the lowest; then
#   count: [streams, N] use counter
#   most: 2**bits - 1
State = kernels.state_type(__name__, "count", "most")


@njit(inline="always")
def on_hit(s, row, e):
    s.count[row, e] = min(s.count[row, e] + 1, s.most)


@njit(inline="always")
def victim(s, row, e, busy):
    while True:
        x = kernels.following(s, row, QUEUE)
        if s.count[row, x] == 0 and not busy[x]:
            return x
        kernels.put(s, row, x, QUEUE)
        if not busy[x]:
            s.count[row, x] -= 1


@njit(inline="always")
def on_insert(s, row, e):
    kernels.put(s, row, e, QUEUE)
    s.count[row, e] = 0


kernels.register(State, on_hit, kernels.nothing, victim, kernels.drop, on_insert)


class Clock(kernels.CompiledEventPolicy):
    name = "clock"
    libcachesim = "Clock"  # the same algorithm there (tests/test_zoo.py)

    def __init__(self, capacity, num_experts, top_k, bits: int = 1):
        super().__init__(capacity, num_experts, top_k)
        if bits < 1:
            raise MoecacheError(f"policy {self.name}: bits {bits} must be >= 1")
        self.most = 2**bits - 1

    def new_state(self, streams):
        count = np.zeros((streams, self.num_experts), dtype=np.int64)
        return State(**kernels.lists(streams, self.num_experts), count=count, most=self.most)
