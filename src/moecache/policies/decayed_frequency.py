"""Decayed frequency: evict the resident with the lowest exponentially decayed use count."""

import numpy as np

from moecache.errors import MoecacheError
from moecache.policies.eviction import EvictionPolicy


class DecayedFrequency(EvictionPolicy):
    name = "decayed-frequency"

    def __init__(self, capacity, num_experts, top_k, decay: float = 0.9):
        super().__init__(capacity, num_experts, top_k)
        if not 0 < decay < 1:
            raise MoecacheError(f"policy {self.name}: decay {decay} must lie in (0, 1)")
        self.decay = decay

    def reset(self, future=None, streams=1):
        super().reset(future, streams)
        self.score = np.zeros((streams, self.num_experts))

    def priority(self, t, rows, probs):
        # Ties (equal scores) go to the least recently used, then the lowest id.
        return self.score[rows], self.recency[rows]

    def learn(self, t, rows, at, probs):
        super().learn(t, rows, at, probs)
        self.score[rows] *= self.decay
        self.score.put(at, self.score.take(at) + 1.0)
