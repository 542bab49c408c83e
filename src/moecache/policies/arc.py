"""ARC (Megiddo & Modha, FAST 2003), as libCacheSim's ARC: residents in T1 (seen once) and
T2 (seen again), both LRU, with ghost lists B1 and B2 of evicted ids and a target size p
for T1. A hit moves an expert to T2's head; a miss found in B1 (B2) raises (lowers) p by
max(|B2|/|B1|, 1) (max(|B1|/|B2|, 1)), leaves the ghost list and enters T2; any other miss
enters T1. The victim (REPLACE) is T1's tail when T1 is non-empty and above p (or equal
to p for a B2 miss) or T2 is empty, else T2's tail; it joins B1 or B2. For a miss in no
list, the full pool first trims the ghosts as libCacheSim does: when |T1| + |B1| = C, B1's
oldest goes (T1's tail is dropped without a ghost if B1 is empty); when all four lists
hold 2C, B2's oldest goes.

Per token: a victim is the least recent resident of the chosen list that the token does
not need, from the other list when the chosen one holds only the token's experts.
"""

from collections import OrderedDict
from types import SimpleNamespace

from moecache.policies.base import EventPolicy


class ARC(EventPolicy):
    name = "arc"

    def new_stream(self):
        t1, t2, b1, b2 = (OrderedDict() for _ in range(4))  # each least recent first
        return SimpleNamespace(t1=t1, t2=t2, b1=b1, b2=b2, p=0.0, ghost=None, ghostless=False)

    def on_hit(self, s, e):
        s.t1.pop(e, None)
        s.t2.pop(e, None)
        s.t2[e] = None

    def on_miss(self, s, e):
        s.ghost = None
        if e in s.b1:
            s.p = min(s.p + max(len(s.b2) / len(s.b1), 1), self.capacity)
            del s.b1[e]
            s.ghost = "b1"
        elif e in s.b2:
            s.p = max(s.p - max(len(s.b1) / len(s.b2), 1), 0)
            del s.b2[e]
            s.ghost = "b2"

    def victim(self, s, e, needed):
        s.ghostless = False
        if s.ghost is None:
            if len(s.t1) + len(s.b1) + 1 > self.capacity:
                if not s.b1:
                    s.ghostless = True
                    return self.pick(s.t1, s.t2, needed)
                s.b1.popitem(last=False)
            elif len(s.t1) + len(s.b1) + len(s.t2) + len(s.b2) >= 2 * self.capacity and s.b2:
                s.b2.popitem(last=False)
        t1 = len(s.t1)
        if (t1 and (t1 > s.p or (t1 == s.p and s.ghost == "b2"))) or not s.t2:
            return self.pick(s.t1, s.t2, needed)
        return self.pick(s.t2, s.t1, needed)

    @staticmethod
    def pick(first, second, needed):
        return next(x for q in (first, second) for x in q if x not in needed)

    def on_evict(self, s, e):
        lst, ghosts = (s.t1, s.b1) if e in s.t1 else (s.t2, s.b2)
        del lst[e]
        if not s.ghostless:
            ghosts[e] = None

    def on_insert(self, s, e):
        (s.t1 if s.ghost is None else s.t2)[e] = None
        s.ghost = None
