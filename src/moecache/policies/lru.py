"""Least recently used: evict the resident whose last request is oldest."""

from moecache.policies.eviction import EvictionPolicy


class LRU(EvictionPolicy):
    name = "lru"

    def priority(self, t, rows, probs):
        return self.least_recent(rows)
