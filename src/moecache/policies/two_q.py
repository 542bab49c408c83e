"""2Q (Johnson & Shasha 1994), full version as in libCacheSim's TwoQ: new experts enter A1in
(FIFO, `ain` = int(C * 0.25) slots); hits there change nothing. When the pool is full and
A1in holds more than its share, A1in's oldest is evicted and remembered in the ghost FIFO
A1out (int(C * 0.5) ids); otherwise Am's (LRU) least recent is evicted. A miss remembered
in A1out enters Am.

libCacheSim admits nothing when A1in's share rounds to 0 (C < 4); here such a pool still
takes every miss into A1in. Per token: victims are the oldest (least recent) residents
the token does not need, from the other queue when the chosen one holds none.
"""

from collections import OrderedDict
from types import SimpleNamespace

from moecache.errors import MoecacheError
from moecache.policies.base import EventPolicy


class TwoQ(EventPolicy):
    name = "two-q"

    def __init__(self, capacity, num_experts, top_k, ain: float = 0.25, aout: float = 0.5):
        super().__init__(capacity, num_experts, top_k)
        if not (0 <= ain < 1 and aout >= 0):
            raise MoecacheError(f"policy {self.name}: need 0 <= ain {ain} < 1, aout {aout} >= 0")
        self.ain, self.aout = int(capacity * ain), int(capacity * aout)

    def new_stream(self):
        return SimpleNamespace(ain=OrderedDict(), am=OrderedDict(), out=OrderedDict(), seen=False)

    def on_hit(self, s, e):
        if e in s.am:
            s.am.move_to_end(e)

    def on_miss(self, s, e):
        s.seen = s.out.pop(e, False) is None

    def victim(self, s, e, needed):
        first, second = (s.ain, s.am) if len(s.ain) > self.ain else (s.am, s.ain)
        return next(x for q in (first, second) for x in q if x not in needed)

    def on_evict(self, s, e):
        if s.am.pop(e, False) is None:
            return
        del s.ain[e]
        if self.aout:
            s.out[e] = None
            if len(s.out) > self.aout:
                s.out.popitem(last=False)

    def on_insert(self, s, e):
        (s.am if s.seen else s.ain)[e] = None
