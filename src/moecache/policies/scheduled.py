"""Restricting policies that change the cache only at scheduled refreshes (ScheduledPolicy)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moecache.policies.policy import Policy, PoolChange


class ScheduledPolicy(Policy):
    """Restricting: the cache changes only at scheduled refreshes, which copy just the
    experts not yet resident; between them nothing is copied and the router chooses
    among the resident experts."""

    restricts = True

    def reset(self, future=None, streams: int = 1) -> None:
        super().reset(future, streams)
        # Each expert's last_use key (0: never requested); last_request // top_k - 1 is
        # the token of its last request.
        self.last_request = np.zeros(self.num_experts, dtype=np.int64)

    def change(self, t, request, probs, resident) -> PoolChange:
        self.record(t, request)
        self.last_request[list(request)] = self.last_use(t, len(request))
        if not self.due(t):
            return PoolChange()
        # Residents outside the target leave least recently requested first (one token's
        # experts in request order, as for LRU).
        return self.cache_to(self.target(t), resident, lambda e: (self.last_request[e], e))

    def record(self, t: int, request: Sequence[int]) -> None:
        """Record token t's demand (the router's unrestricted top-k)."""

    def due(self, t: int) -> bool:
        raise NotImplementedError

    def target(self, t: int) -> list[int]:
        """The experts the refresh at token t makes resident (at most `capacity`)."""
        raise NotImplementedError
