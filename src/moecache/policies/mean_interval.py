"""Predicted time to next use: each expert's next request is forecast as its last use plus
its mean interval between requests; evict the resident forecast to return last."""

import numpy as np

from moecache.policies.eviction import EvictionPolicy


class MeanInterval(EvictionPolicy):
    name = "mean-interval"

    def reset(self, future=None, streams=1):
        super().reset(future, streams)
        self.first_use = np.full((streams, self.num_experts), -1, dtype=np.int64)
        self.uses = np.zeros((streams, self.num_experts), dtype=np.int64)

    def priority(self, t, rows, probs):
        recency, uses = self.recency[rows], self.uses[rows]
        last = recency // self.top_k - 1  # the token of the last use (-1: never)
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = (last - self.first_use[rows]) / (uses - 1)
        # No interval seen yet: no reason to expect it back, so it returns last of all.
        forecast = np.where(uses < 2, np.inf, last + mean)
        # Latest forecast first; ties to the least recently used, then the lowest id.
        return -forecast, recency

    def learn(self, t, rows, at, probs):
        uses = self.uses.take(at)
        self.first_use.put(at, np.where(uses == 0, t, self.first_use.take(at)))
        self.uses.put(at, uses + 1)
        super().learn(t, rows, at, probs)
