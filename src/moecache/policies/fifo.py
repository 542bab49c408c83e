"""FIFO: evict the expert inserted longest ago (Belady, Nelson & Shedler 1969); hits change
nothing. libCacheSim: FIFO.

Per token: the victim is the oldest resident the token does not need.
"""

from collections import OrderedDict

from moecache.policies.base import EventPolicy


class FIFO(EventPolicy):
    name = "fifo"

    def new_stream(self):
        return OrderedDict()  # resident experts, oldest first

    def victim(self, s, e, needed):
        return next(x for x in s if x not in needed)

    def on_evict(self, s, e):
        del s[e]

    def on_insert(self, s, e):
        s[e] = None
