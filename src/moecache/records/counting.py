"""Fills and steady copies: how a pool's copies are counted, defined once.

A pool holds at most C experts (its capacity) of one restricted layer for one sequence (a
stream, in replay) and starts it empty. It copies experts in groups: a group is the copies
made together at one point of the decoding. In the blocking harness it is one plan's
admitted experts (harness/pool.py); in the overlapped harness one submission of demand or
of prefetched copies (harness/async_pool.py); in replay one token of a stream
(replay/engine.py, and compiled in policies/kernels.py) or one round of a batched step
(replay/batch.py).

- The pool *has been full* once a group has left it holding C experts, and stays so for
  the rest of the sequence whatever it evicts later (a lossless pool stays full anyway:
  its victims only make room; a restricting refresh evicts only as far as room is needed).
- A *fill* is a copy of a group that starts before the pool has been full: what filling
  the empty pool costs. The whole group that first brings the pool to C experts counts as
  fills: a group is never split at the boundary.
- A *steady copy* is a copy of a group that starts once the pool has been full: each takes
  the slot of an evicted expert. These are the paper's steady-state transfers ("a pool
  counts as filling until it has been full once").

Every copy is one or the other: fills + steady = insertions. The paper's steady traffic B
(replay's `after_fill`) is another count: the insertions beyond the first min(C, distinct)
experts, which splits no group either but ignores where groups begin, so the fills exceed
min(C, distinct) by the boundary group's copies past it (the appendix: 4,263 LRU fills in
the harness, 4,096 in replay).

`split` and `has_been_full` are plain arithmetic: on numbers (the harness, one group at a
time), on numpy arrays (replay, one element per token) and, compiled where they are called
(numba.njit), inside the replay kernels. `after_fill` is B, for a replay or an optimum's
insertions.
"""

from __future__ import annotations

import numpy as np


def split(copies, been_full):
    """(fills, steady) of a group of `copies` that starts when the pool `been_full` (has
    been full before it). Elementwise over arrays: copies [..., T] and been_full [..., T]."""
    steady = copies * been_full
    return copies - steady, steady


def has_been_full(been_full, held, capacity):
    """Whether the pool has been full after a group that left it holding `held` experts,
    given whether it had been before (`been_full`); elementwise over arrays."""
    return been_full | (held == capacity)


def after_fill(insertions, distinct, capacity):
    """The paper's steady traffic B: `insertions` beyond the first min(C, distinct), the
    experts every schedule copies in once (`distinct`: those requested at least once).
    Elementwise over arrays: insertions [streams] and distinct [streams]."""
    return insertions - np.minimum(capacity, distinct)
