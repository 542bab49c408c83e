"""Reuse distance: evict the resident whose estimated next use is farthest away.

Each expert keeps an exponentially weighted mean of the tokens between its successive
requests (weight `weight` on the newest distance; `prior` tokens before it has one). Its
next use is estimated as its last use plus that mean; an expert already past its estimate
is expected `overdue` times its mean later again (0: at once, the next token). The
farthest estimate is evicted, ties to the least recently used, then the lowest id: a
causal imitation of farthest-future (it reads requests up to token t only). The defaults
are the training trace's best point (learned.causal).
"""

import numpy as np

from moecache.errors import MoecacheError
from moecache.policies.eviction import EvictionPolicy


class ReuseDistance(EvictionPolicy):
    name = "reuse-distance"

    def __init__(
        self,
        capacity,
        num_experts,
        top_k,
        weight: float = 0.15,
        prior: float = 64.0,
        overdue: float = 0.5,
    ):
        super().__init__(capacity, num_experts, top_k)
        if not 0 < weight <= 1:
            raise MoecacheError(f"policy {self.name}: weight {weight} must lie in (0, 1]")
        if prior <= 0 or overdue < 0:
            raise MoecacheError(
                f"policy {self.name}: prior {prior} must be positive, overdue {overdue} "
                "not negative"
            )
        self.weight, self.prior, self.overdue = weight, prior, overdue

    def reset(self, future=None, streams=1):
        super().reset(future, streams)
        self.last = np.full((streams, self.num_experts), -1.0)  # last token of use
        self.mean = np.full((streams, self.num_experts), self.prior)  # mean reuse distance

    def next_use(self, t, rows):
        """Estimated token of each expert's next use (never used: its prior after t)."""
        last, mean = self.last[rows], self.mean[rows]
        due = np.where(last < 0, t + mean, last + mean)
        late = due <= t
        return np.where(late, t + 1 + self.overdue * mean, due)

    def priority(self, t, rows, probs):
        return -self.next_use(t, rows), self.recency[rows]

    def learn(self, t, rows, at, probs):
        super().learn(t, rows, at, probs)
        last, mean = self.last.take(at), self.mean.take(at)
        seen = last >= 0
        blended = (1 - self.weight) * mean + self.weight * (t - last)
        self.mean.put(at, np.where(seen, blended, mean))
        self.last.put(at, float(t))
