"""ARC (Megiddo & Modha, FAST 2003), as libCacheSim's ARC: residents in T1 (seen once) and
T2 (seen again), both LRU, with ghost lists B1 and B2 of evicted ids and a target size p
for T1. A hit moves an expert to T2's head; a miss found in B1 (B2) raises (lowers) p by
max(|B2|/|B1|, 1) (max(|B1|/|B2|, 1)), leaves the ghost list and enters T2; any other miss
enters T1. The victim (REPLACE) is T1's tail when T1 is non-empty and above p (or equal
to p for a B2 miss) or T2 is empty, else T2's tail; it joins B1 or B2. For a miss in no
list, the full pool first trims the ghosts as libCacheSim does: when |T1| + |B1| = C, B1's
oldest goes (T1's tail is dropped without a ghost if B1 is empty); when all four lists
hold 2C, B2's oldest goes.

Per token: a victim is the least recent resident of the chosen list that the token does
not need, from the other list when the chosen one holds only the token's experts.
"""

import numpy as np
from numba import njit

from moecache.policies import kernels

NONE, T1, T2, B1, B2 = 0, 1, 2, 3, 4  # list ids; B1 and B2 hold ids of evicted experts


# State: the lists' arrays (kernels.lists), where [streams, N] T1, T2, B1, B2 or NONE, stamp
#   [streams, N] recency within a list; then p: [streams] target kernels.size of T1 ghost:
#   [streams] the ghost list the current miss was found in (NONE) ghostless: [streams] the victim
#   leaves no ghost capacity:
State = kernels.state_type(__name__, "p", "ghost", "ghostless", "capacity")


@njit(inline="always")
def on_hit(s, row, e):
    kernels.put(s, row, e, T2)


@njit(inline="always")
def on_miss(s, row, e):
    s.ghost[row] = NONE
    if s.where[row, e] == B1:
        s.p[row] = min(
            s.p[row] + max(kernels.size(s, row, B2) / kernels.size(s, row, B1), 1), s.capacity
        )
    elif s.where[row, e] == B2:
        s.p[row] = max(s.p[row] - max(kernels.size(s, row, B1) / kernels.size(s, row, B2), 1), 0)
    else:
        return
    s.ghost[row] = s.where[row, e]
    kernels.drop(s, row, e)


@njit(inline="always")
def pick(s, row, first, second, busy):
    x = kernels.oldest(s, row, first, busy)
    return x if x >= 0 else kernels.oldest(s, row, second, busy)


@njit(inline="always")
def forget_oldest(s, row, ghosts):
    kernels.drop(s, row, kernels.following(s, row, ghosts))


@njit(inline="always")
def victim(s, row, e, busy):
    t1, t2, b1, b2 = (
        kernels.size(s, row, T1),
        kernels.size(s, row, T2),
        kernels.size(s, row, B1),
        kernels.size(s, row, B2),
    )
    s.ghostless[row] = False
    if s.ghost[row] == NONE:
        if t1 + b1 + 1 > s.capacity:
            if b1 == 0:
                s.ghostless[row] = True
                return pick(s, row, T1, T2, busy)
            forget_oldest(s, row, B1)
        elif t1 + b1 + t2 + b2 >= 2 * s.capacity and b2:
            forget_oldest(s, row, B2)
    p = s.p[row]
    if (t1 and (t1 > p or (t1 == p and s.ghost[row] == B2))) or not t2:
        return pick(s, row, T1, T2, busy)
    return pick(s, row, T2, T1, busy)


@njit(inline="always")
def on_evict(s, row, e):
    ghosts = B1 if s.where[row, e] == T1 else B2
    kernels.drop(s, row, e)
    if not s.ghostless[row]:
        kernels.put(s, row, e, ghosts)


@njit(inline="always")
def on_insert(s, row, e):
    kernels.put(s, row, e, T1 if s.ghost[row] == NONE else T2)
    s.ghost[row] = NONE


kernels.register(State, on_hit, on_miss, victim, on_evict, on_insert)


class ARC(kernels.CompiledEventPolicy):
    name = "arc"
    libcachesim = "ARC"  # the same algorithm there (tests/test_zoo.py)

    def new_state(self, streams):
        return State(
            **kernels.lists(streams, self.num_experts),
            p=np.zeros(streams, dtype=np.float64),
            ghost=np.zeros(streams, dtype=np.int64),
            ghostless=np.zeros(streams, dtype=np.bool_),
            capacity=self.capacity,
        )
