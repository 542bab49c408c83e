"""FIFO: evict the expert inserted longest ago (Belady, Nelson & Shedler 1969); hits change
nothing. libCacheSim: FIFO.

Per token: the victim is the oldest resident the token does not need.
"""

from numba import njit

from moecache.policies import kernels

QUEUE = 1


# State: the lists' arrays (kernels.lists), where [streams, N] QUEUE while resident, stamp
#   [streams, N] insertion order.
State = kernels.state_type(__name__)


@njit(inline="always")
def victim(s, row, e, busy):
    return kernels.oldest(s, row, QUEUE, busy)


@njit(inline="always")
def on_insert(s, row, e):
    kernels.put(s, row, e, QUEUE)


kernels.register(State, kernels.nothing, kernels.nothing, victim, kernels.drop, on_insert)


class FIFO(kernels.CompiledEventPolicy):
    name = "fifo"
    libcachesim = "FIFO"  # the same algorithm there (tests/test_zoo.py)

    def new_state(self, streams):
        return State(**kernels.lists(streams, self.num_experts))
