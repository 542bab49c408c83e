"""Segmented LRU (Karedla, Love & Wherry 1994), as libCacheSim's SLRU: `segments` LRU lists
(default 4), lowest first. A miss enters the lowest segment with room (the lowest, once
the pool is full); a hit moves an expert to the head of the next segment up (or of the top
one), and a segment over its size pushes its tail down to the head of the one below; the
victim is the tail of the lowest non-empty segment.

Sizes: libCacheSim gives each segment C // segments and leaves the remainder unused (and
admits nothing below C = segments); here the remainder goes to the lowest segments, so
the pool holds all C experts: the two agree exactly when segments divides C.

Per token: the victim is the least recent resident, lowest segment first, that the token
does not need. Segment i is list FIRST + i; W-TinyLFU reuses these functions for its
main cache.
"""

import numpy as np
from numba import njit

from moecache.errors import MoecacheError
from moecache.policies import kernels

FIRST = 1


# State: the lists' arrays (kernels.lists), where [streams, N] FIRST + segment while resident,
#   stamp [streams, N] recency within a segment; then
#   sizes: [segments] slots, lowest first
State = kernels.state_type(__name__, "sizes")


@njit(inline="always")
def enter(s, row, e, first, sizes):
    """A new expert enters the lowest segment with room (the lowest when none has)."""
    for i in range(len(sizes)):
        if kernels.size(s, row, first + i) < sizes[i]:
            kernels.put(s, row, e, first + i)
            return
    kernels.put(s, row, e, first)


@njit(inline="always")
def promote(s, row, e, first, sizes):
    """A hit: e up one segment; each segment over its kernels.size pushes its tail down one."""
    i = min(s.where[row, e] - first + 1, len(sizes) - 1)
    kernels.put(s, row, e, first + i)
    while i > 0 and kernels.size(s, row, first + i) > sizes[i]:
        kernels.put(s, row, kernels.following(s, row, first + i), first + i - 1)
        i -= 1


@njit(inline="always")
def lowest(s, row, busy, first, count):
    """The least recent expert not needed, lowest segment first (-1: none); one pass."""
    found, best = -1, (count, 0)
    for x in range(s.where.shape[1]):
        key = (s.where[row, x] - first, s.stamp[row, x])
        if 0 <= key[0] < count and key < best and not busy[x]:
            found, best = x, key
    return found


@njit(inline="always")
def on_hit(s, row, e):
    promote(s, row, e, FIRST, s.sizes)


@njit(inline="always")
def victim(s, row, e, busy):
    return lowest(s, row, busy, FIRST, len(s.sizes))


@njit(inline="always")
def on_insert(s, row, e):
    enter(s, row, e, FIRST, s.sizes)


def split(total: int, parts: int) -> list[int]:
    """`total` slots in `parts` near-equal shares, the larger ones lowest."""
    return [total // parts + (i < total % parts) for i in range(parts)]


kernels.register(State, on_hit, kernels.nothing, victim, kernels.drop, on_insert)


class SLRU(kernels.CompiledEventPolicy):
    name = "slru"
    libcachesim = "SLRU"  # the same algorithm there (tests/test_zoo.py)

    def __init__(self, capacity, num_experts, top_k, segments: int = 4):
        super().__init__(capacity, num_experts, top_k)
        if segments < 1:
            raise MoecacheError(f"policy {self.name}: segments {segments} must be >= 1")
        self.segments = segments

    def new_state(self, streams):
        sizes = np.array(split(self.capacity, self.segments), dtype=np.int64)
        return State(**kernels.lists(streams, self.num_experts), sizes=sizes)
