"""Predicted time to next use: each expert's next request is forecast as its last use plus
its mean interval between requests; evict the resident forecast to return last."""

import numpy as np

from moecache.policies.base import EvictionPolicy


class MeanInterval(EvictionPolicy):
    name = "mean-interval"

    def reset(self, future=None):
        super().reset(future)
        self.first_use = np.full(self.num_experts, -1, dtype=np.int64)
        self.uses = np.zeros(self.num_experts, dtype=np.int64)

    def forecast(self, e: int) -> float:
        if self.uses[e] < 2:
            return float("inf")  # no interval seen yet: no reason to expect it back
        mean = (self.last_use[e] - self.first_use[e]) / (self.uses[e] - 1)
        return self.last_use[e] + mean

    def victim(self, t, candidates, probs):
        return max(candidates, key=lambda e: (self.forecast(e), -self.last_use[e], -e))

    def observe(self, t, request, probs):
        request = list(request)
        fresh = [e for e in request if self.uses[e] == 0]
        self.first_use[fresh] = t
        self.uses[request] += 1
        super().observe(t, request, probs)
