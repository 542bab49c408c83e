"""LFU: evict the resident with the fewest requests since it was inserted, ties to the
least recently used; as libCacheSim's LFU, whose frequency buckets keep their experts in
the order they reached that count (so the tie goes to the oldest last access). Counts
are forgotten on eviction (in-cache LFU).

Per token: hits and insertions are stamped in request order; the victim is the lowest
(count, stamp) among residents the token does not need.
"""

from types import SimpleNamespace

from moecache.policies.base import EventPolicy


class LFU(EventPolicy):
    name = "lfu"

    def new_stream(self):
        return SimpleNamespace(count={}, stamp={}, clock=0)

    def touch(self, s, e, count):
        s.count[e], s.stamp[e], s.clock = count, s.clock, s.clock + 1

    def on_hit(self, s, e):
        self.touch(s, e, s.count[e] + 1)

    def victim(self, s, e, needed):
        return min((x for x in s.count if x not in needed), key=lambda x: (s.count[x], s.stamp[x]))

    def on_evict(self, s, e):
        del s.count[e], s.stamp[e]

    def on_insert(self, s, e):
        self.touch(s, e, 1)
