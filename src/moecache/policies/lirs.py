"""LIRS (Jiang & Zhang, SIGMETRICS 2002): experts with a short reuse distance (LIR) keep
C - H slots; the other residents (HIR) share H = max(top_k, int(C * 0.01)) slots in the
FIFO Q, whose front is the victim. The LRU stack S holds the LIR experts and recently
seen HIR ones (resident or not) and is pruned so that its bottom is LIR. A HIR expert
requested while still in S has a reuse distance below the bottom LIR's: it becomes LIR
and the bottom LIR drops to the end of Q. Until C - H experts are LIR, every miss becomes
LIR.

libCacheSim's LIRS takes the same parameters (H = max(1, int(C * 0.01))) but departs from
the paper: a hit on a HIR expert outside S demotes the bottom LIR and evicts a HIR
expert (the pool shrinks on a hit), and a miss found in S demotes two LIR experts. So
its misses differ; the test holds this rule to a plain reference of the paper's
algorithm and to libCacheSim within a stated margin. Per token: H >= top_k, so Q always
holds an expert the token does not need; the victim is the first such in Q (if none, the
least recent LIR expert the token does not need).

An expert can be in S and Q at once: Q is a list (where, stamp), S its own order (in_s,
s_stamp).
"""

import numpy as np
from numba import njit

from moecache.policies import kernels

Q = 1


# State: the lists' arrays (kernels.lists), where [streams, N] Q for a resident HIR expert, stamp
#   [streams, N] order in Q; then
#   in_s: [streams, N] in the stack S
#   s_stamp: [streams, N] order in S (higher: nearer the top)
#   lir: [streams, N]
#   lirs_now: [streams] LIR experts
#   nobody: [N] all false: no expert is skipped
#   lirs: C - H: slots of the LIR experts
State = kernels.state_type(__name__, "in_s", "s_stamp", "lir", "lirs_now", "nobody", "lirs")


@njit(inline="always")
def mark(s, row, e, lir):
    """e becomes LIR (or HIR), counted."""
    s.lirs_now[row] += lir - s.lir[row, e]
    s.lir[row, e] = lir


@njit(inline="always")
def push(s, row, e):
    """e to the top of S."""
    s.in_s[row, e] = True
    s.clock[row] += 1
    s.s_stamp[row, e] = s.clock[row]


@njit(inline="always")
def bottom(s, row, lir_only, busy):
    """The lowest expert in S (only LIR ones, and none in busy, if asked; -1: none)."""
    best, found = kernels.FAR, -1
    for x in range(len(busy)):
        ok = s.in_s[row, x] and not busy[x] and (s.lir[row, x] or not lir_only)
        if ok and s.s_stamp[row, x] < best:
            best, found = s.s_stamp[row, x], x
    return found


@njit(inline="always")
def prune(s, row, nobody):
    while True:
        x = bottom(s, row, False, nobody)
        if x < 0 or s.lir[row, x]:
            return
        s.in_s[row, x] = False


@njit(inline="always")
def promote(s, row, e, nobody):
    """e (HIR, in S) becomes LIR; the bottom LIR, if over C - H, becomes resident HIR."""
    mark(s, row, e, True)
    if s.lirs_now[row] > s.lirs:
        x = bottom(s, row, True, nobody)
        mark(s, row, x, False)
        kernels.put(s, row, x, Q)
    prune(s, row, nobody)


@njit(inline="always")
def on_hit(s, row, e):
    nobody = s.nobody
    if s.lir[row, e]:
        push(s, row, e)
        prune(s, row, nobody)
    elif s.in_s[row, e]:
        push(s, row, e)
        kernels.drop(s, row, e)
        promote(s, row, e, nobody)
    else:
        push(s, row, e)
        kernels.put(s, row, e, Q)


@njit(inline="always")
def victim(s, row, e, busy):
    hir = kernels.oldest(s, row, Q, busy)
    return hir if hir >= 0 else bottom(s, row, True, busy)


@njit(inline="always")
def on_evict(s, row, e):
    if s.where[row, e] == Q:
        kernels.drop(s, row, e)  # a resident HIR: S remembers it, non-resident
        return
    mark(s, row, e, False)
    s.in_s[row, e] = False
    prune(s, row, s.nobody)


@njit(inline="always")
def on_insert(s, row, e):
    if s.lirs_now[row] < s.lirs:
        mark(s, row, e, True)
        push(s, row, e)
    elif s.in_s[row, e]:
        push(s, row, e)
        promote(s, row, e, s.nobody)
    else:
        push(s, row, e)
        kernels.put(s, row, e, Q)


kernels.register(State, on_hit, kernels.nothing, victim, on_evict, on_insert)


class LIRS(kernels.CompiledEventPolicy):
    name = "lirs"
    libcachesim = "LIRS"  # the same algorithm there (tests/test_zoo.py)

    def __init__(self, capacity, num_experts, top_k):
        super().__init__(capacity, num_experts, top_k)
        self.lirs = capacity - max(top_k, int(capacity * 0.01))

    def new_state(self, streams):
        shape = (streams, self.num_experts)
        return State(
            **kernels.lists(*shape),
            in_s=np.zeros(shape, dtype=np.bool_),
            s_stamp=np.zeros(shape, dtype=np.int64),
            lir=np.zeros(shape, dtype=np.bool_),
            lirs_now=np.zeros(streams, dtype=np.int64),
            nobody=np.zeros(self.num_experts, dtype=np.bool_),
            lirs=self.lirs,
        )
