"""CLOCK (Corbato 1968), as libCacheSim's Clock: a FIFO queue whose tail is the hand; each
expert has an n-bit use counter (`bits`, default 1), 0 on insertion, +1 per hit up to
2**bits - 1. To evict, the hand takes the tail: a counter above 0 is decremented and the
expert goes to the head; the first expert found at 0 is evicted.

Per token: the hand passes over the token's own experts untouched (they go to the head
without losing their count), so none of them is evicted for another.
"""

from collections import OrderedDict

from moecache.errors import MoecacheError
from moecache.policies.base import EventPolicy


class Clock(EventPolicy):
    name = "clock"

    def __init__(self, capacity, num_experts, top_k, bits: int = 1):
        super().__init__(capacity, num_experts, top_k)
        if bits < 1:
            raise MoecacheError(f"policy {self.name}: bits {bits} must be >= 1")
        self.most = 2**bits - 1

    def new_stream(self):
        return OrderedDict()  # expert -> counter, tail (next under the hand) first

    def on_hit(self, s, e):
        s[e] = min(s[e] + 1, self.most)

    def victim(self, s, e, needed):
        while True:
            x, count = next(iter(s.items()))
            if count == 0 and x not in needed:
                return x
            s.move_to_end(x)
            if x not in needed:
                s[x] = count - 1

    def on_evict(self, s, e):
        del s[e]

    def on_insert(self, s, e):
        s[e] = 0
