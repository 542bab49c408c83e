"""2Q (Johnson & Shasha 1994), full version as in libCacheSim's TwoQ: new experts enter A1in
(FIFO, `ain` = int(C * 0.25) slots); hits there change nothing. When the pool is full and
A1in holds more than its share, A1in's oldest is evicted and remembered in the ghost FIFO
A1out (int(C * 0.5) ids); otherwise Am's (LRU) least recent is evicted. A miss remembered
in A1out enters Am.

libCacheSim admits nothing when A1in's share rounds to 0 (C < 4); here such a pool still
takes every miss into A1in. Per token: victims are the oldest (least recent) residents
the token does not need, from the other queue when the chosen one holds none.
"""

import numpy as np
from numba import njit

from moecache.errors import MoecacheError
from moecache.policies import kernels

AIN, AM, OUT = 1, 2, 3  # list ids; OUT holds ids of evicted experts


# State: the lists' arrays (kernels.lists), where [streams, N] AIN, AM, OUT or 0, stamp [streams,
#   N] order within a list; then
#   seen: [streams] the current miss was found in OUT
#   ain: A1in's share
#   aout: A1out's length
State = kernels.state_type(__name__, "seen", "ain", "aout")


@njit(inline="always")
def on_hit(s, row, e):
    if s.where[row, e] == AM:
        kernels.put(s, row, e, AM)


@njit(inline="always")
def on_miss(s, row, e):
    kernels.recall(s, row, e, OUT)


@njit(inline="always")
def victim(s, row, e, busy):
    first, second = (AIN, AM) if kernels.size(s, row, AIN) > s.ain else (AM, AIN)
    x = kernels.oldest(s, row, first, busy)
    return x if x >= 0 else kernels.oldest(s, row, second, busy)


@njit(inline="always")
def on_evict(s, row, e):
    kernels.evict_remembering(s, row, e, AIN, OUT, s.aout)


@njit(inline="always")
def on_insert(s, row, e):
    kernels.put(s, row, e, AM if s.seen[row] else AIN)


kernels.register(State, on_hit, on_miss, victim, on_evict, on_insert)


class TwoQ(kernels.CompiledEventPolicy):
    name = "two-q"
    libcachesim = "TwoQ"  # the same algorithm there (tests/test_zoo.py)

    def __init__(self, capacity, num_experts, top_k, ain: float = 0.25, aout: float = 0.5):
        super().__init__(capacity, num_experts, top_k)
        if not (0 <= ain < 1 and aout >= 0):
            raise MoecacheError(f"policy {self.name}: need 0 <= ain {ain} < 1, aout {aout} >= 0")
        self.ain, self.aout = int(capacity * ain), int(capacity * aout)

    def new_state(self, streams):
        seen = np.zeros(streams, dtype=np.bool_)
        return State(
            **kernels.lists(streams, self.num_experts), seen=seen, ain=self.ain, aout=self.aout
        )
