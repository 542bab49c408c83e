"""W-TinyLFU (Einziger, Friedman & Manes, ACM TOS 2017), as libCacheSim's WTinyLFU: new
experts enter an LRU window of max(top_k, int(C * window)) slots; the rest is an SLRU main
cache (probation, then a protected segment of int(0.8 * main)). When the pool is full the
window's least recent expert is the candidate: it moves to main while main has room, else
it competes with main's victim (probation's tail) and the less frequent goes, ties against
the candidate. Frequencies count insertions, hits in main and candidacies, as libCacheSim
adds to its sketch, and halve after 32 * main hits in main.

Differences from libCacheSim, by cause: (1) frequencies are exact counts, where
libCacheSim estimates them with a counting Bloom filter (xxHash, 0.1% error) whose
collisions inflate some; (2) exactly one expert leaves per miss, where libCacheSim's
eviction loop goes on after an admitted candidate has displaced main's victim (evicting
again, so its pool can sit below C); (3) libCacheSim admits nothing when its window rounds
to 0 slots (C < 100 at 1%) and splits main 1:4 with truncation (a slot may go unused).
The test holds this rule to a plain reference and to libCacheSim within a stated margin.
Per token: candidates and victims are the least recent experts the token does not need.
"""

import numpy as np
from numba import njit

from moecache.errors import MoecacheError
from moecache.policies import kernels
from moecache.policies.slru import enter, lowest, promote

WINDOW, MAIN = 1, 2  # list ids: the window, then main's segments (probation, protected)


# State: the lists' arrays (kernels.lists), where [streams, N] WINDOW, MAIN + segment, or 0, stamp
#   [streams, N] recency within a list; then
#   count: [streams, N] frequency (kept after eviction, halved)
#   hits: [streams] hits in main since the last halving
#   move: [streams] the candidate that displaced main's victim (-1: none)
#   sizes: main's segments: probation, protected
#   main: main's slots
State = kernels.state_type(__name__, "count", "hits", "move", "sizes", "main")


@njit(inline="always")
def in_main(s, row):
    return kernels.size(s, row, MAIN) + kernels.size(s, row, MAIN + 1)


@njit(inline="always")
def on_hit(s, row, e):
    if s.where[row, e] == WINDOW:
        kernels.put(s, row, e, WINDOW)
        return
    promote(s, row, e, MAIN, s.sizes)
    s.count[row, e] += 1
    s.hits[row] += 1
    if s.hits[row] >= 32 * s.main:
        s.hits[row] = 0
        s.count[row] >>= 1


@njit(inline="always")
def victim(s, row, e, busy):
    s.move[row] = -1
    while True:
        candidate = kernels.oldest(s, row, WINDOW, busy)
        if candidate < 0:
            return lowest(s, row, busy, MAIN, 2)
        if in_main(s, row) < s.main:
            enter(s, row, candidate, MAIN, s.sizes)
            s.count[row, candidate] += 1
            continue
        rival = lowest(s, row, busy, MAIN, 2)
        won = rival >= 0 and s.count[row, candidate] > s.count[row, rival]
        s.count[row, candidate] += 1
        if not won:
            return candidate
        s.move[row] = candidate
        return rival


@njit(inline="always")
def on_evict(s, row, e):
    was = s.where[row, e]
    kernels.drop(s, row, e)
    if was != WINDOW and s.move[row] >= 0:
        enter(s, row, s.move[row], MAIN, s.sizes)


@njit(inline="always")
def on_insert(s, row, e):
    kernels.put(s, row, e, WINDOW)
    s.count[row, e] += 1


kernels.register(State, on_hit, kernels.nothing, victim, on_evict, on_insert)


class WTinyLFU(kernels.CompiledEventPolicy):
    name = "w-tinylfu"
    libcachesim = "WTinyLFU"  # the same algorithm there (tests/test_zoo.py)

    def __init__(self, capacity, num_experts, top_k, window: float = 0.01):
        super().__init__(capacity, num_experts, top_k)
        if not 0 <= window < 1:
            raise MoecacheError(f"policy {self.name}: window {window} must lie in [0, 1)")
        self.window = min(capacity, max(top_k, int(capacity * window)))
        self.main = capacity - self.window
        self.protected = int(self.main * 0.8)

    def new_state(self, streams):
        n = self.num_experts
        return State(
            **kernels.lists(streams, n),
            count=np.zeros((streams, n), dtype=np.int64),
            hits=np.zeros(streams, dtype=np.int64),
            move=np.full(streams, -1, dtype=np.int64),
            sizes=np.array([self.main - self.protected, self.protected], dtype=np.int64),
            main=self.main,
        )
