"""W-TinyLFU (Einziger, Friedman & Manes, ACM TOS 2017), as libCacheSim's WTinyLFU: new
experts enter an LRU window of max(top_k, int(C * window)) slots; the rest is an SLRU main
cache (probation, then a protected segment of int(0.8 * main)). When the pool is full the
window's least recent expert is the candidate: it moves to main while main has room, else
it competes with main's victim (probation's tail) and the less frequent goes, ties against
the candidate. Frequencies count insertions, hits in main and candidacies, as libCacheSim
adds to its sketch, and halve after 32 * main hits in main.

Differences from libCacheSim, by cause: (1) frequencies are exact counts, where
libCacheSim estimates them with a counting Bloom filter (xxHash, 0.1% error) whose
collisions inflate some; (2) exactly one expert leaves per miss, where libCacheSim's
eviction loop goes on after an admitted candidate has displaced main's victim (evicting
again, so its pool can sit below C); (3) libCacheSim admits nothing when its window rounds
to 0 slots (C < 100 at 1%) and splits main 1:4 with truncation (a slot may go unused).
The test holds this rule to a plain reference and to libCacheSim within a stated margin.
Per token: candidates and victims are the least recent experts the token does not need.
"""

from collections import OrderedDict
from types import SimpleNamespace

from moecache.errors import MoecacheError
from moecache.policies.base import EventPolicy
from moecache.policies.slru import Segments


class WTinyLFU(EventPolicy):
    name = "w-tinylfu"

    def __init__(self, capacity, num_experts, top_k, window: float = 0.01):
        super().__init__(capacity, num_experts, top_k)
        if not 0 <= window < 1:
            raise MoecacheError(f"policy {self.name}: window {window} must lie in [0, 1)")
        self.window = min(capacity, max(top_k, int(capacity * window)))
        self.main = capacity - self.window
        self.protected = int(self.main * 0.8)

    def new_stream(self):
        main = Segments([self.main - self.protected, self.protected])
        return SimpleNamespace(w=OrderedDict(), m=main, count={}, hits=0, move=None)

    def add(self, s, e):
        s.count[e] = s.count.get(e, 0) + 1

    def on_hit(self, s, e):
        if e in s.w:
            s.w.move_to_end(e)
            return
        s.m.hit(e)
        self.add(s, e)
        s.hits += 1
        if s.hits >= 32 * self.main:
            s.hits, s.count = 0, {x: c >> 1 for x, c in s.count.items()}

    def victim(self, s, e, needed):
        s.move = None
        while True:
            candidate = next((x for x in s.w if x not in needed), None)
            if candidate is None:
                return s.m.victim(needed)
            if len(s.m) < self.main:
                del s.w[candidate]
                s.m.insert(candidate)
                self.add(s, candidate)
                continue
            rival = s.m.victim(needed)
            won = rival is not None and s.count.get(candidate, 0) > s.count.get(rival, 0)
            self.add(s, candidate)
            if not won:
                return candidate
            s.move = candidate
            return rival

    def on_evict(self, s, e):
        if s.w.pop(e, False) is None:
            return
        s.m.remove(e)
        if s.move is not None:
            del s.w[s.move]
            s.m.insert(s.move)

    def on_insert(self, s, e):
        s.w[e] = None
        self.add(s, e)
