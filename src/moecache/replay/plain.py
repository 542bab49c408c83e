"""Per-request LRU and Belady's MIN in plain Python, for a trace too small to repay numba.

`moecache replay --per-request` on one shard (about 10^5 single requests) is over before
numba has started: importing it and loading the cached kernels of the compiled replay
(moecache.replay.engine.compiled) costs about 0.45 s, while these loops take about 0.07 s
for both rules (0.65 s per million requests against the kernels' 0.15 plus that start).
Above `PLAIN_REQUESTS` single requests the compiled kernels win and moecache.replay.flat
uses them. Both give the same counts as the kernels with k = 1 (tests/test_replay_startup.py
checks them against each other): LRU evicts the least recently requested expert; MIN the
one requested again latest, ties (experts never requested again) to the least recently
requested. No numba, no policies here: that is the point. moecache.replay.flat.replayed_once
chooses; timings of the compiled replay (benchmark-per-request) keep the kernels.
"""

from __future__ import annotations

import heapq

import numpy as np

from moecache.records.demand import Demand

PLAIN_REQUESTS = 500_000  # single requests over all streams; above, numba is faster
RULES = ("lru", "farthest-future")


def fits(demand: Demand, text: str) -> bool:
    """Whether rule `text` over the flattened `demand` runs here rather than compiled."""
    return text in RULES and int(demand.lengths.sum()) <= PLAIN_REQUESTS


def replay(text: str, demand: Demand, capacity: int):
    """Copies [S, T] per single request and whether the pool had been full before it, as
    moecache.replay.engine.compiled gives them for a demand of one request per token."""
    copies = np.zeros(demand.requests.shape[:2], dtype=np.int64)
    full = np.zeros(demand.requests.shape[:2], dtype=bool)
    count = lru if text == "lru" else farthest
    never = demand.requests.shape[1] + 1  # the kernels' never: the padded length, plus one
    for row, length in enumerate(demand.lengths.tolist()):
        stream = demand.requests[row, :length, 0]
        copies[row, :length] = count(stream.tolist(), capacity, after(stream, never))
        full[row, :length] = been_full(stream, capacity)
    return copies, full


def lru(stream: list[int], capacity: int, _after) -> list[int]:
    """1 where the request misses: a dict kept in recency order is the LRU list."""
    resident: dict[int, None] = {}
    misses = [0] * len(stream)
    for i, e in enumerate(stream):
        if e in resident:
            del resident[e]
        else:
            misses[i] = 1
            if len(resident) == capacity:
                del resident[next(iter(resident))]
        resident[e] = None
    return misses


def farthest(stream: list[int], capacity: int, after: list[int]) -> list[int]:
    """1 where the request misses under MIN: a heap of (-next use, last request) with the
    entries of re-requested experts left stale and skipped."""
    last: dict[int, int] = {}  # resident expert -> the index of its latest request
    heap: list[tuple[int, int, int]] = []
    misses = [0] * len(stream)
    for i, e in enumerate(stream):
        if e not in last:
            misses[i] = 1
            if len(last) == capacity:
                while True:
                    _, at, victim = heapq.heappop(heap)
                    if last.get(victim) == at:
                        del last[victim]
                        break
        last[e] = i
        heapq.heappush(heap, (-after[i], i, e))
    return misses


def after(stream: np.ndarray, never: int) -> list[int]:
    """For each request, the index of the next request of the same expert (never: none)."""
    order = np.lexsort((np.arange(len(stream)), stream))
    following = np.full(len(stream), never, dtype=np.int64)
    same = stream[order[1:]] == stream[order[:-1]]
    following[order[:-1][same]] = order[1:][same]
    return following.tolist()


def been_full(stream: np.ndarray, capacity: int) -> np.ndarray:
    """Whether the pool had been full before each request: a lossless pool holds, until
    it first fills, every distinct expert requested so far (records/counting.py)."""
    first = np.zeros(len(stream), dtype=np.int64)
    _, at = np.unique(stream, return_index=True)
    first[at] = 1
    held = np.cumsum(first)
    return np.concatenate([[False], held[:-1] >= capacity])
