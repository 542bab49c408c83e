"""FIFO: evict the expert inserted longest ago (Belady, Nelson & Shedler 1969); hits change
nothing. libCacheSim: FIFO.

Per token: the victim is the oldest resident the token does not need.
"""

from typing import NamedTuple

import numpy as np
from numba import njit

from moecache.policies.kernels import (
    CompiledEventPolicy,
    drop,
    lists,
    nothing,
    oldest,
    put,
    register,
)

QUEUE = 1


class State(NamedTuple):
    where: np.ndarray  # [streams, N] QUEUE while resident
    stamp: np.ndarray  # [streams, N] insertion order
    clock: np.ndarray  # [streams]
    held: np.ndarray  # [streams, LISTS] length of each list


@njit(inline="always")
def victim(s, row, e, busy):
    return oldest(s, row, QUEUE, busy)


@njit(inline="always")
def on_evict(s, row, e):
    drop(s, row, e)


@njit(inline="always")
def on_insert(s, row, e):
    put(s, row, e, QUEUE)


register(State, nothing, nothing, victim, on_evict, on_insert)


class FIFO(CompiledEventPolicy):
    name = "fifo"

    def new_state(self, streams):
        return State(**lists(streams, self.num_experts))
