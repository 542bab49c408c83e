"""Lossless eviction rules that rank experts (EvictionPolicy): vectorised over streams."""

from __future__ import annotations

import numpy as np

from moecache.errors import MoecacheError
from moecache.policies.policy import Policy, PoolChange
from moecache.policies.pools import NONE, OUTSIDE, Pools, StepChange

NOT_CANDIDATE = np.iinfo(np.int64).max  # sorts after every folded key
# A folded key is key * N + id (+ OUTSIDE when not resident): keys below 2**40 keep it
# exact and the residents first for any N up to 2**21.
KEY_LIMIT = 2**40


class EvictionPolicy(Policy):
    """Lossless: every requested expert is copied in at once; the rule only picks the
    victims, among residents the current token does not need.

    A rule is two methods over state arrays shaped [streams, N]: `priority` ranks the
    experts (lowest evicted first) and `learn` updates them from each token after its
    victims are chosen. The harness drives one stream through `change`; trace replay drives many
    streams at once through `step`, so a rule's copy count is defined once. At token t the
    streams still running are the first n rows (`rows` = slice(0, n)), and `at` [n, k]
    holds the flat indices (row * N + expert) of the experts each requests, for np.take
    and np.put on any state array.
    """

    many_streams = True

    def reset(self, future=None, streams: int = 1) -> None:
        super().reset(future, streams)
        self.start = np.arange(streams)[:, None] * self.num_experts  # flat index of each row
        # Each expert's last_use key (0: never requested), so that it is itself the LRU
        # key: (1 + t) * top_k + its position in the request of t, its last token.
        self.recency = np.zeros((streams, self.num_experts), dtype=np.int64)

    def priority(self, t: int, rows: slice, probs):
        """Eviction order of the experts of the streams in `rows`: one non-negative integer
        key per expert ([n, N], below KEY_LIMIT, checked; lower goes first, ties to the
        lower id), or a tuple of arrays of any dtype, most significant first (slower)."""
        raise NotImplementedError

    def learn(self, t: int, rows: slice, at: np.ndarray, probs) -> None:
        """Learn from token t after its victims are chosen (default: recency). `at` keeps
        each stream's request order, which orders the token's experts by recency."""
        self.recency.put(at, np.broadcast_to(self.last_use(t, at.shape[1]), at.shape))

    def step(self, t: int, at: np.ndarray, probs, pools: Pools) -> StepChange:
        """Decide token t for the first n = len(at) streams, given the flat indices `at`
        [n, k] of their requests and the router's `probs` [n, N] (or None)."""
        n = len(at)
        rows = slice(0, n)
        miss = pools.base.take(at) >= OUTSIDE
        copies = miss.sum(axis=1)
        need = pools.count[:n] + copies - self.capacity
        most = need.max(initial=0)
        victims = NONE
        if most > 0:
            order = self.eviction_order(t, rows, at, probs, pools, most)
            victims = order[np.arange(most) < need[:, None]]
        self.learn(t, rows, at, probs)
        return StepChange(at, miss, copies, victims)

    def eviction_order(self, t, rows, at, probs, pools, most: int) -> np.ndarray:
        """The `most` first victims per stream, as flat indices, in `priority` order
        (residents only; the current token's experts never)."""
        keys = self.priority(t, rows, probs)
        n, start = self.num_experts, self.start[rows]
        if isinstance(keys, np.ndarray):
            self.check_keys(t, keys)
            folded = keys * n + pools.base[rows]  # sorting values beats argsort severalfold
            folded.put(at, NOT_CANDIDATE)
            return np.sort(folded, axis=1)[:, :most] % n + start
        blocked = pools.base[rows] >= OUTSIDE
        blocked.put(at, True)
        ids = np.broadcast_to(np.arange(n), blocked.shape)
        return np.lexsort((ids, *reversed(keys), blocked), axis=-1)[:, :most] + start

    def check_keys(self, t: int, keys: np.ndarray) -> None:
        """Refuse integer keys the folding in eviction_order cannot hold."""
        low, high = keys.min(initial=0), keys.max(initial=0)
        if low < 0 or high >= KEY_LIMIT:
            raise MoecacheError(
                f"policy {self.name}: priority key {high if high >= KEY_LIMIT else low} at "
                f"token {t} is outside 0 .. 2**40 - 1"
            )

    def change(self, t, request, probs, resident) -> PoolChange:
        pools = Pools.holding(resident, self.num_experts, self.capacity)
        probs = None if probs is None else np.asarray(probs)[None]
        step = self.step(t, np.asarray([request]), probs, pools)
        admit = [int(e) for e, m in zip(request, step.miss[0], strict=True) if m]
        return PoolChange(admit=admit, evict=sorted(step.victims.tolist()))

    def compiled_state(self, requests: np.ndarray, lengths: np.ndarray):
        """The state of a compiled replay of every stream of `requests` [S, T, k] (padded
        past `lengths`): a NamedTuple whose class has hooks registered in kernels.py, or
        None where this rule (with these parameters) has none and replay steps it."""
        return None

    def least_recent(self, rows: slice) -> np.ndarray:
        """The LRU key: never-used experts first, then by last use; experts last used by
        the same token in their order in its request (see last_use)."""
        return self.recency[rows]
