"""Lookahead k: the same layer's recorded demand over the next k tokens, from the trace,
the soonest first; a prefetch counts as used if one of those k tokens requests it."""

from moecache.errors import MoecacheError
from moecache.prefetch.base import Prefetcher, Want, recorded


class Lookahead(Prefetcher):
    name = "lookahead"
    needs_trace = True

    def __init__(self, k: int = 1):
        if k < 1:
            raise MoecacheError(f"prefetch {self.name}: k {k} must be >= 1")
        self.k = k

    def want(self, block, t, hidden):
        ahead = [recorded(block, t + i) for i in range(1, self.k + 1)]
        ahead = [demand for demand in ahead if demand is not None]
        if not ahead:
            return None
        experts = list(dict.fromkeys(e for demand in ahead for e in demand))
        return Want(block, t + len(ahead), experts)
