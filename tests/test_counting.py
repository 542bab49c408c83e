"""The one counting rule (records/counting.py): a pool's copies are fills until it has been
full once, the group that first fills it included, and steady copies after."""

from __future__ import annotations

import numpy as np

from moecache.records import counting


def count(groups, capacity):
    """(fills, steady) of a pool that only grows, given each group's copies."""
    fills = steady = held = 0
    been_full = False
    for copies in groups:
        f, s = counting.split(copies, been_full)
        fills, steady = fills + f, steady + s
        held = min(capacity, held + copies)
        been_full = counting.has_been_full(been_full, held, capacity)
    return fills, steady


def test_the_group_that_first_fills_the_pool_still_fills():
    assert count([3, 2], capacity=4) == (5, 0)  # the second group crosses C: all fills
    assert count([3, 2, 1], capacity=4) == (5, 1)
    assert count([4, 1, 1], capacity=4) == (4, 2)
    assert count([], capacity=4) == (0, 0)


def test_arrays_count_as_numbers_do():
    """Replay's form: per token, copies and whether the pool had been full before it."""
    copies = np.array([[3, 2, 1, 0, 2], [4, 0, 1, 1, 0]])
    full = np.array([[False, False, True, True, True], [False, True, True, True, True]])
    fills, steady = counting.split(copies, full)
    assert fills.sum(axis=1).tolist() == [5, 4] and steady.sum(axis=1).tolist() == [3, 2]
    assert counting.has_been_full(np.array([False, True]), np.array([4, 2]), 4).tolist() == [
        True,
        True,
    ]


def test_after_fill_is_the_copies_beyond_the_first_min_c_distinct():
    """B: a stream of 6 distinct experts at C = 4 pays its first 4 copies in any schedule;
    one of 3 distinct experts its first 3."""
    assert counting.after_fill(9, 6, 4) == 5
    assert counting.after_fill(3, 3, 4) == 0
    found = counting.after_fill(np.array([9, 3]), np.array([6, 3]), 4)
    assert found.tolist() == [5, 0]
