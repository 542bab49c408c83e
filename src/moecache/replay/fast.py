"""Compiled replay of the two reference rules, LRU and farthest-future (full lookahead,
unit costs): every stream start to end in one numba call, the counts of the vectorised
rules exactly (moecache.policies.lru, farthest_future; tests/test_fast_replay.py checks
them against each other), at compiled speed: per token, the residents the token does not
need are scanned once per copy for the victim.

The rules' keys, as in the policies: LRU evicts the lowest recency, (1 + t) * k + the
expert's position in token t's request (0: never requested); farthest-future evicts the
latest next use, ties (experts next requested by the same token, or never again) to the
lowest recency, then the lowest id. With k = 1 (per-request counting, moecache.replay.
flat) the two are classic LRU and Belady's MIN.

Compiled with `kernels.compiled` (cached in the rules' folder), counting with the one rule
(records/counting.py, `kernels.has_been_full`).
"""

from __future__ import annotations

import numpy as np

from moecache.policies.farthest_future import FarthestFuture
from moecache.policies.kernels import compiled, has_been_full
from moecache.policies.lru import LRU

RULES = ("lru", "farthest-future")  # the rules compiled here, when given no parameters


def fast_rule(policy) -> str | None:
    """'lru' or 'farthest-future' when `policy` is one of the plain rules compiled here."""
    if type(policy) is LRU:
        return "lru"
    if type(policy) is FarthestFuture and policy.foresight is None and policy.level is None:
        return "farthest-future"
    return None


def replay(rule: str, requests: np.ndarray, lengths: np.ndarray, capacity: int, width: int):
    """Copies [S, T] per token and whether the pool was full before it, for `rule` over
    requests [S, T, k] (expert ids, padded past `lengths`)."""
    kernel = replay_lru if rule == "lru" else replay_farthest
    return kernel(np.ascontiguousarray(requests, dtype=np.int64), lengths, capacity, width)


@compiled
def replay_lru(requests, lengths, capacity, width):
    streams, steps, k = requests.shape
    copies = np.zeros((streams, steps), dtype=np.int64)
    full = np.zeros((streams, steps), dtype=np.bool_)
    resident = np.zeros(width, dtype=np.bool_)
    busy = np.zeros(width, dtype=np.bool_)
    recency = np.zeros(width, dtype=np.int64)
    for row in range(streams):
        resident[:] = False
        recency[:] = 0
        held, been_full = 0, False
        for t in range(lengths[row]):
            request = requests[row, t]
            misses = 0
            for j in range(k):
                busy[request[j]] = True
                misses += not resident[request[j]]
            full[row, t] = been_full
            copies[row, t] = misses
            for _ in range(held + misses - capacity):
                best, victim = np.int64(-1), -1
                for x in range(width):
                    if resident[x] and not busy[x] and (victim < 0 or recency[x] < best):
                        best, victim = recency[x], x
                resident[victim] = False
            held = min(capacity, held + misses)
            been_full = has_been_full(been_full, held, capacity)
            for j in range(k):
                e = request[j]
                resident[e] = True
                busy[e] = False
                recency[e] = (1 + t) * k + j
    return copies, full


@compiled
def next_uses(requests, length, width, never):
    """after[t, j]: the next token after t that requests requests[t, j] (never: none);
    first[e]: the first token that requests e."""
    k = requests.shape[1]
    after = np.empty((length, k), dtype=np.int64)
    seen = np.full(width, never, dtype=np.int64)
    for t in range(length - 1, -1, -1):
        for j in range(k):
            after[t, j] = seen[requests[t, j]]
        for j in range(k):
            seen[requests[t, j]] = t
    return after, seen


@compiled
def replay_farthest(requests, lengths, capacity, width):
    streams, steps, k = requests.shape
    copies = np.zeros((streams, steps), dtype=np.int64)
    full = np.zeros((streams, steps), dtype=np.bool_)
    resident = np.zeros(width, dtype=np.bool_)
    busy = np.zeros(width, dtype=np.bool_)
    recency = np.zeros(width, dtype=np.int64)
    never = steps + 1  # the policy's never: the padded length, plus one
    for row in range(streams):
        length = lengths[row]
        after, ahead = next_uses(requests[row], length, width, never)
        resident[:] = False
        recency[:] = 0
        held, been_full = 0, False
        for t in range(length):
            request = requests[row, t]
            misses = 0
            for j in range(k):
                busy[request[j]] = True
                misses += not resident[request[j]]
            full[row, t] = been_full
            copies[row, t] = misses
            for _ in range(held + misses - capacity):
                victim = -1
                for x in range(width):
                    if not resident[x] or busy[x]:
                        continue
                    if (
                        victim < 0
                        or ahead[x] > ahead[victim]
                        or (ahead[x] == ahead[victim] and recency[x] < recency[victim])
                    ):
                        victim = x
                resident[victim] = False
            held = min(capacity, held + misses)
            been_full = has_been_full(been_full, held, capacity)
            for j in range(k):
                e = request[j]
                resident[e] = True
                busy[e] = False
                recency[e] = (1 + t) * k + j
                ahead[e] = after[t, j]
    return copies, full
