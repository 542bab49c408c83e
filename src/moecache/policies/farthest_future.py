"""Farthest future (Belady's rule) and its limited-foresight variant.

Reads the demand recorded by an earlier run of the same sequences; because eviction never
changes routing, that is exactly the demand this run will see. With `foresight` k, only
requests in the next k tokens are visible: residents not requested within them are equal,
and the least recently used of those goes. Ties of next use (with or without foresight) go
to the least recently used too, experts last used by one token in its request order
(EvictionPolicy.last_use), then to the lowest id.

With per-expert reload `costs` (experts kept at mixed precision), the victim is the
resident cheapest to copy back, ties as above: an expert not requested again (or not
within the foresight) costs nothing to lose and still goes first. Unit costs, the default,
are the plain rule, optimal by docs/optimum.md; under unequal costs neither ranking is
(replay.bound.mixed_precision measures both against the LP).

The plain rule (full lookahead, unit costs) is compiled for replay through the kernel
table (kernels.py): a resident's key is `ranked`'s, learnt once its token is in
(on_token) from the next uses read off the whole demand when the replay starts, and FAR
once evicted; the victim is the lowest key the token does not need (kernels.lowest).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from moecache.errors import MoecacheError
from moecache.policies import kernels
from moecache.policies.eviction import EvictionPolicy

# State (compiled replay): key [streams, N] each resident's rank (FAR: not resident),
# after [streams, T, k] the next token that requests each request's expert (never: none),
# tokens [streams] the tokens seen, never (T + 1).
State = namedtuple("State", ("key", "after", "tokens", "never"), module=__name__)


@njit(inline="always")
def on_token(s, row, request):
    """Token t's experts' keys: (never - next use) * never * k + recency (see ranked)."""
    k, t, never = len(request), s.tokens[row], s.never
    for j in range(k):
        s.key[row, request[j]] = (never - s.after[row, t, j]) * (never * k) + (1 + t) * k + j
    s.tokens[row] = t + 1


kernels.register_keyed(State, on_token)


class FarthestFuture(EvictionPolicy):
    name = "farthest-future"
    needs_future = True

    def __init__(self, capacity, num_experts, top_k, foresight: int | None = None, costs=None):
        super().__init__(capacity, num_experts, top_k)
        if foresight is not None and foresight < 1:
            raise MoecacheError(f"policy {self.name}: foresight {foresight} must be >= 1")
        self.foresight = foresight
        self.level = None if costs is None else cost_levels(self.name, costs, num_experts)

    def reset(self, future=None, streams=1):
        """`future`: one stream's requests per token, or [streams, T, k] ids padded with -1."""
        super().reset(future, streams)
        demand = np.asarray(future, dtype=np.int64)
        # Rows as wide as recorded: a batched step's union may be wider than one request.
        demand = demand.reshape(streams, -1, demand.shape[-1])
        # ahead[s, e]: the next token that requests e; after[t]: what it becomes once
        # token t has used its experts, for the experts at recorded[t] (flat indices, in
        # the recorded order, which a run may permute).
        self.after, self.ahead, self.never = next_requests(demand, self.num_experts)
        self.recorded = (np.maximum(demand, 0) + self.start[:, :, None]).transpose(1, 0, 2)
        self.key = self.ranked(self.ahead, self.recency, slice(None))

    def change(self, t, request, probs, resident):
        if t >= len(self.after) or sorted(self.future[t]) != sorted(request):
            raise MoecacheError(
                f"policy {self.name}: the recorded trace does not match this run at token {t}"
            )
        return super().change(t, request, probs, resident)

    def ranked(self, ahead, recency, experts):
        """Farthest next use first, then the least recently used; with costs, the cheapest
        to reload before both (`experts` indexes the cost level of each key). Recency keys
        stay below never * top_k (last_use of a token t < never - 1), so unit-cost keys
        below span = (never + 1) * never * top_k, and keys with costs below
        (levels + 1) * span."""
        key = (self.never - ahead) * (self.never * self.top_k) + recency
        if self.level is None:
            return key
        level = np.where(ahead < self.never, self.level[experts], 0)
        return level * ((self.never + 1) * self.never * self.top_k) + key

    def priority(self, t, rows, probs):
        if self.foresight is None:
            return self.key[rows]
        ahead = self.ahead[rows]
        return self.ranked(
            np.where(ahead - t > self.foresight, self.never, ahead),
            self.recency[rows],
            slice(None),
        )

    def compiled_state(self, requests, lengths):
        """Full lookahead at unit costs only; with foresight or costs replay steps the rule."""
        if type(self) is not FarthestFuture or self.foresight is not None or self.level is not None:
            return None
        requests = np.ascontiguousarray(requests, dtype=np.int64)
        streams, never = len(requests), requests.shape[1] + 1  # as next_requests's
        return State(
            np.full((streams, self.num_experts), kernels.FAR, dtype=np.int64),
            next_uses(requests, lengths, self.num_experts, never),
            np.zeros(streams, dtype=np.int64),
            never,
        )

    def learn(self, t, rows, at, probs):
        super().learn(t, rows, at, probs)
        # Only the experts token t used change: their next use, their recency and key
        # (the same experts as `at`, in the recorded order that `after` follows).
        recorded, after = self.recorded[t, rows], self.after[t, rows]
        self.ahead.put(recorded, after)
        ranked = self.ranked(after, self.recency.take(recorded), recorded % self.num_experts)
        self.key.put(recorded, ranked)


def cost_levels(name: str, costs, num_experts: int) -> np.ndarray:
    """Each expert's reload cost as its rank among the distinct costs, from 1 (the
    cheapest): integer keys that order exactly as the costs do."""
    costs = np.asarray(costs, dtype=np.float64)
    if costs.shape != (num_experts,) or not np.isfinite(costs).all() or (costs < 0).any():
        raise MoecacheError(
            f"policy {name}: costs must be {num_experts} finite non-negative numbers, one "
            f"per expert (got shape {costs.shape})"
        )
    return np.unique(costs, return_inverse=True)[1].astype(np.int64) + 1


def next_requests(demand: np.ndarray, num_experts: int):
    """For [streams, T, k] requests (PAD < 0 after a stream's end), returns
    after [T, streams, k]: the next token at which each request's expert is requested again;
    first [streams, N]: the first token that requests each expert; and `never` (T + 1),
    their value where there is none."""
    streams, steps, k = demand.shape
    never = np.int64(steps + 1)  # a NumPy integer, so keys computed from it stay int64
    width = num_experts + 1  # column N takes the padding
    seen = np.full((streams, width), never, dtype=np.int64)
    at = np.where(demand < 0, num_experts, demand) + (np.arange(streams) * width)[:, None, None]
    at = at.transpose(1, 0, 2).copy()  # token-major
    after = np.empty((steps, streams, k), dtype=np.int64)
    for t in range(steps - 1, -1, -1):
        after[t] = seen.take(at[t])
        seen.put(at[t], t)
    return after, seen[:, :num_experts].copy(), never


@kernels.compiled
def next_uses(requests, lengths, width, never):
    """next_requests's `after` for the compiled replay, stream-major: [S, T, k], the next
    token of each stream that requests each request's expert (never: none; past a
    stream's length, unset)."""
    streams, steps, k = requests.shape
    after = np.empty((streams, steps, k), dtype=np.int64)
    seen = np.empty(width, dtype=np.int64)
    for row in range(streams):
        seen[:] = never
        for t in range(lengths[row] - 1, -1, -1):
            for j in range(k):
                after[row, t, j] = seen[requests[row, t, j]]
            for j in range(k):
                seen[requests[row, t, j]] = t
    return after
