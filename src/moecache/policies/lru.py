"""Least recently used: evict the resident whose last request is oldest."""

from moecache.policies.base import EvictionPolicy


class LRU(EvictionPolicy):
    name = "lru"

    def victim(self, t, candidates, probs):
        return self.least_recent(candidates)
