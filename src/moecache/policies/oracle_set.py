"""Oracle set: Dwell-k's refresh schedule, with each set chosen by the sequence's own
routing instead of its past: the C experts its router requests most in the k tokens from
the refresh on (ties to the earlier first request). The paper's "fixed
set, oracle selection" row of Table 2, at the switch rate of the Dwell-k it shadows.
"""

from __future__ import annotations

import numpy as np

from moecache.policies.dwell import Dwell


class OracleSet(Dwell):
    name = "oracle-set"
    needs_future = True

    def reset(self, future=None, streams=1):
        super().reset(future, streams)
        self.future = np.asarray(future, dtype=np.int64)  # [T, k]: the base class checked it

    def target(self, t):
        ahead = self.future[t : t + self.k].reshape(-1)  # in token, then router order
        experts, first = np.unique(ahead, return_index=True)
        counts = np.bincount(ahead, minlength=self.num_experts)
        ranked = sorted(zip(experts, first, strict=True), key=lambda e: (-counts[e[0]], e[1]))
        return [int(e) for e, _ in ranked[: self.capacity]]
