"""Decayed frequency: evict the resident with the lowest exponentially decayed use count."""

import numpy as np

from moecache.errors import MoecacheError
from moecache.policies.base import EvictionPolicy


class DecayedFrequency(EvictionPolicy):
    name = "decayed-frequency"

    def __init__(self, capacity, num_experts, top_k, decay: float = 0.9):
        super().__init__(capacity, num_experts, top_k)
        if not 0 < decay < 1:
            raise MoecacheError(f"policy {self.name}: decay {decay} must lie in (0, 1)")
        self.decay = decay

    def reset(self, future=None):
        super().reset(future)
        self.score = np.zeros(self.num_experts)

    def victim(self, t, candidates, probs):
        # Ties (equal scores) go to the least recently used, then the lowest id.
        return min(candidates, key=lambda e: (self.score[e], self.last_use[e], e))

    def observe(self, t, request, probs):
        super().observe(t, request, probs)
        self.score *= self.decay
        self.score[list(request)] += 1.0
