"""The exact fewest expert insertions for a demand stream, prefetching allowed; random streams.

A layer has N experts and a cache of C slots. A stream is T tokens, each a set of k expert
ids. A schedule is R_0 = {}, R_1..R_T with |R_t| <= C; it is lossless when S_t is a subset
of R_t for every t, and it costs sum_t |R_t \\ R_{t-1}| insertions (dropping is free, an
expert may be inserted before it is asked for). `exact_insertions` finds the minimum over
all lossless schedules by dynamic programming over the 2^N resident sets, as bitmasks:

    dp_t[R'] = min_R dp_{t-1}[R] + |R' \\ R|
             = |R'| + min_{X subset of R'} (sup[X] - |X|)
    sup[X]   = min_{R superset of X} dp_{t-1}[R]

(X plays R & R'), then dp_t is masked to the sets with |R'| <= C that hold S_t. Both minima
are sum-over-subsets transforms, O(N 2^N) per token, run in numpy over many instances at once.
"""

from __future__ import annotations

import numpy as np

from moecache.config.keys import MAX_EXPERTS
from moecache.errors import MoecacheError
from moecache.records.shape import check_shape

KINDS = ("uniform", "zipf", "bursty")

_INF = 1 << 30  # an unreachable resident set; every reachable cost is at most T * C
_BLOCK_STATES = 1 << 21  # resident sets * instances solved at once: 8 MiB of int32


def exact_insertions(requests: np.ndarray, num_experts: int, capacity: int) -> np.ndarray:
    """The minimum insertions over all lossless schedules, one per instance.

    `requests`: integer array [I, T, k] of expert ids in [0, num_experts); a token is the
    set of its ids. Returns int64 [I]. Instances are solved in blocks of about 2^21 resident
    sets, so memory stays small (tens of MiB) however large I is.
    """
    requests = np.asarray(requests)
    if requests.ndim != 3:
        raise MoecacheError(
            f"exact optimum: requests must be [instances, tokens, k], got shape {requests.shape}"
        )
    if requests.size and not np.issubdtype(requests.dtype, np.integer):
        raise MoecacheError(f"exact optimum: expert ids must be integers, got {requests.dtype}")
    count, tokens, k = requests.shape
    if num_experts > MAX_EXPERTS:
        raise MoecacheError(
            f"exact optimum: N experts means 2^N resident sets; at most {MAX_EXPERTS} "
            f"supported, got {num_experts}"
        )
    check_shape(k or None, capacity, num_experts, where="exact optimum")
    if requests.size and (requests.min() < 0 or requests.max() >= num_experts):
        bad = requests[(requests < 0) | (requests >= num_experts)].flat[0]
        raise MoecacheError(f"exact optimum: expert id {int(bad)} out of range [0, {num_experts})")
    if tokens * capacity >= _INF // 2:
        raise MoecacheError(f"exact optimum: {tokens} tokens is too long a stream")

    states = 1 << num_experts
    masks = np.bitwise_or.reduce(
        np.left_shift(np.int64(1), requests.astype(np.int64)), axis=2, initial=0
    ).astype(np.int32)  # [I, T]: the set S_t as a bitmask
    sets = np.arange(states, dtype=np.int32)[:, None]
    size = np.bitwise_count(sets).astype(np.int32)
    # Adding |R'| also rules out the sets over capacity: they get the sentinel on top.
    size_or_full = size + np.where(size > capacity, _INF, 0).astype(np.int32)
    out = np.zeros(count, dtype=np.int64)
    block = max(1, _BLOCK_STATES // states)
    for start in range(0, count, block):
        stop = min(count, start + block)
        out[start:stop] = _solve(masks[start:stop], num_experts, sets, size, size_or_full)
    return out


def _solve(masks, num_experts, sets, size, size_or_full):
    """The DP for one block of instances; `masks` [I, T] holds each token's set as bits.

    dp is [2^N, I], the instances last, so every step of the transforms runs over long
    contiguous rows. Values are exact costs (at most T * C) or at least the sentinel.
    """
    count, tokens = masks.shape
    dp = np.full((1 << num_experts, count), _INF, dtype=np.int32)
    dp[0] = 0
    missing = np.empty(dp.shape, dtype=bool)
    for t in range(tokens):
        _superset_min(dp, num_experts)  # sup[X]
        dp -= size  # sup[X] - |X|
        _subset_min(dp, num_experts)  # min over X subset of R': finite, X = {} always counts
        dp += size_or_full  # |R'| + ..., or the sentinel when |R'| > C
        need = masks[:, t]
        np.not_equal(sets & need, need, out=missing)  # R' lacks part of S_t
        np.copyto(dp, _INF, where=missing)
    return dp.min(axis=0)


def _superset_min(a, n):
    """a[X] <- min over R superset of X of a[R] along axis 0, in place."""
    for i in range(n):
        v = a.reshape(-1, 2, (1 << i) * a.shape[1])  # [.., bit i clear / set, ..]
        np.minimum(v[:, 0], v[:, 1], out=v[:, 0])


def _subset_min(a, n):
    """a[R] <- min over X subset of R of a[X] along axis 0, in place."""
    for i in range(n):
        v = a.reshape(-1, 2, (1 << i) * a.shape[1])
        np.minimum(v[:, 1], v[:, 0], out=v[:, 1])


def generate(
    rng: np.random.Generator, kind: str, count: int, tokens: int, num_experts: int, top_k: int
) -> np.ndarray:
    """`count` random demand streams, int64 [count, tokens, top_k], ids sorted in each token.

    uniform: each token is top_k distinct experts, uniformly.
    zipf: each instance ranks the experts by a random permutation and draws each token's
    top_k without replacement with weights 1 / rank^a, a drawn per instance from [0.8, 1.5].
    bursty: a working set that drifts; token 1 is uniform, then each of the previous
    token's experts stays with probability p (drawn per instance from [0.6, 0.9]) and the
    rest are filled uniformly from the experts the previous token did not use (from the
    dropped ones too only when N < 2k leaves too few).
    """
    if kind not in KINDS:
        raise MoecacheError(f"unknown stream kind {kind!r} (known: {', '.join(KINDS)})")
    check_shape(top_k, None, num_experts, where="streams")
    if count < 0 or tokens < 0:
        raise MoecacheError(f"streams: count and tokens must be >= 0, got {count}, {tokens}")
    shape = (count, tokens, num_experts)
    if kind == "uniform":
        keys = rng.random(shape)
    elif kind == "zipf":
        # Efraimidis-Spirakis: the top_k smallest Exp(1) / weight are a weighted draw
        # without replacement.
        alpha = rng.uniform(0.8, 1.5, size=count)
        rank = np.argsort(rng.random((count, num_experts)), axis=1) + 1  # random permutation
        weight = rank ** -alpha[:, None]
        keys = rng.standard_exponential(shape) / weight[:, None, :]
    else:
        return _bursty(rng, count, tokens, num_experts, top_k)
    return _smallest(keys, top_k)


def _smallest(keys, k):
    """Indices of the k smallest keys along the last axis, sorted ascending by index."""
    part = np.argpartition(keys, k - 1, axis=-1)[..., :k]
    return np.sort(part, axis=-1).astype(np.int64)


def _bursty(rng, count, tokens, num_experts, top_k):
    out = np.empty((count, tokens, top_k), dtype=np.int64)
    if tokens == 0:
        return out
    stay = rng.uniform(0.6, 0.9, size=count)[:, None]
    rows = np.arange(count)[:, None]
    out[:, 0] = _smallest(rng.random((count, num_experts)), top_k)
    for t in range(1, tokens):
        previous = np.zeros((count, num_experts), dtype=bool)
        previous[rows, out[:, t - 1]] = True
        kept = previous & (rng.random((count, num_experts)) < stay)
        keys = rng.random((count, num_experts))  # fresh experts: uniform in [0, 1)
        keys[kept] = -1.0  # kept experts come first
        keys[previous & ~kept] += 2.0  # dropped ones last, only if fresh ones run out
        out[:, t] = _smallest(keys, top_k)
    return out
