"""No prefetching: every copy is made on demand (the blocking runs' schedule, overlapped)."""

from moecache.prefetch.base import Prefetcher


class NoPrefetch(Prefetcher):
    name = "none"

    def want(self, block, t, hidden):
        return None
