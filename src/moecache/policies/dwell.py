"""Dwell-k with a demand window w, and Static as its k = infinity case.

Refresh at every token until the window first fills (the warm start), then every k
tokens, with the experts most requested in the last w tokens (the current one included);
ties go to the more recently requested (by token), then the lower id. Residents outside the
target leave least recently requested first (ScheduledPolicy).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from moecache.errors import MoecacheError
from moecache.policies.scheduled import ScheduledPolicy


class Dwell(ScheduledPolicy):
    name = "dwell"

    def __init__(self, capacity, num_experts, top_k, k: int = 16, window: int | None = None):
        super().__init__(capacity, num_experts, top_k)
        window = k if window is None else window
        if k < 1 or window < 1:
            raise MoecacheError(f"policy {self.name}: k {k} and window {window} must be >= 1")
        self.k, self.window = k, window

    def reset(self, future=None, streams=1):
        super().reset(future, streams)
        self.recent = deque(maxlen=self.window)
        self.counts = np.zeros(self.num_experts, dtype=np.int64)

    def record(self, t, request):
        if len(self.recent) == self.window:
            self.counts[list(self.recent[0])] -= 1
        self.recent.append(tuple(request))
        self.counts[list(request)] += 1

    def due(self, t):
        filled = self.window - 1  # the token at which the window first fills
        return t <= filled or (t - filled) % self.k == 0

    def target(self, t):
        wanted = np.flatnonzero(self.counts)
        last = self.last_request // self.top_k  # 1 + the token of the last request
        ranked = sorted(wanted, key=lambda e: (-self.counts[e], -last[e], e))
        return [int(e) for e in ranked[: self.capacity]]


class Static(Dwell):
    """Filled from the first `window` tokens' demand (64 in the paper), then fixed."""

    name = "static"

    def __init__(self, capacity, num_experts, top_k, window: int = 64):
        super().__init__(capacity, num_experts, top_k, k=1, window=window)

    def due(self, t):
        return t < self.window
