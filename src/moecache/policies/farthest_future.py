"""Farthest future (Belady's rule) and its limited-foresight variant.

Reads the demand recorded by an earlier run of the same sequences; because eviction never
changes routing, that is exactly the demand this run will see. With `foresight` k, only
requests in the next k tokens are visible: residents not requested within them are equal,
and the least recently used of those goes.
"""

from __future__ import annotations

import numpy as np

from moecache.errors import MoecacheError
from moecache.policies.base import EvictionPolicy

NEVER = np.iinfo(np.int64).max


class FarthestFuture(EvictionPolicy):
    name = "farthest-future"
    needs_future = True

    def __init__(self, capacity, num_experts, top_k, foresight: int | None = None):
        super().__init__(capacity, num_experts, top_k)
        if foresight is not None and foresight < 1:
            raise MoecacheError(f"policy {self.name}: foresight {foresight} must be >= 1")
        self.foresight = foresight

    def reset(self, future=None):
        super().reset(future)
        # next_use[t, e]: the first token after t that requests e (NEVER if none).
        steps = len(future)
        self.next_use = np.full((steps + 1, self.num_experts), NEVER, dtype=np.int64)
        for t in range(steps - 1, -1, -1):
            self.next_use[t] = self.next_use[t + 1]
            self.next_use[t, list(future[t])] = t
        self.next_use = self.next_use[1:]  # row t now looks strictly after t

    def plan(self, t, request, probs, resident):
        if t >= len(self.future) or sorted(self.future[t]) != sorted(request):
            raise MoecacheError(
                f"policy {self.name}: the recorded trace does not match this run at token {t}"
            )
        return super().plan(t, request, probs, resident)

    def victim(self, t, candidates, probs):
        ahead = self.next_use[t, candidates]
        if self.foresight is not None:
            ahead = np.where(ahead - t > self.foresight, NEVER, ahead)
        farthest = ahead.max()
        tied = [e for e, n in zip(candidates, ahead, strict=True) if n == farthest]
        return self.least_recent(tied)
