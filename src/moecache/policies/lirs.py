"""LIRS (Jiang & Zhang, SIGMETRICS 2002): experts with a short reuse distance (LIR) keep
C - H slots; the other residents (HIR) share H = max(top_k, int(C * 0.01)) slots in the
FIFO Q, whose front is the victim. The LRU stack S holds the LIR experts and recently
seen HIR ones (resident or not) and is pruned so that its bottom is LIR. A HIR expert
requested while still in S has a reuse distance below the bottom LIR's: it becomes LIR
and the bottom LIR drops to the end of Q. Until C - H experts are LIR, every miss becomes
LIR.

libCacheSim's LIRS takes the same parameters (H = max(1, int(C * 0.01))) but departs from
the paper: a hit on a HIR expert outside S demotes the bottom LIR and evicts a HIR
expert (the pool shrinks on a hit), and a miss found in S demotes two LIR experts. So
its misses differ; the test holds this rule to a plain reference of the paper's
algorithm and to libCacheSim within a stated margin. Per token: H >= top_k, so Q always
holds an expert the token does not need; the victim is the first such in Q (if none, the
least recent LIR expert the token does not need).
"""

from collections import OrderedDict
from types import SimpleNamespace

from moecache.policies.base import EventPolicy


class LIRS(EventPolicy):
    name = "lirs"

    def __init__(self, capacity, num_experts, top_k):
        super().__init__(capacity, num_experts, top_k)
        self.lirs = capacity - max(top_k, int(capacity * 0.01))

    def new_stream(self):
        # s: stack, bottom first; q: resident HIR, front first; lir: the LIR experts
        return SimpleNamespace(s=OrderedDict(), q=OrderedDict(), lir=set())

    def prune(self, s):
        while s.s and next(iter(s.s)) not in s.lir:
            s.s.popitem(last=False)

    def promote(self, s, e):
        """e (HIR, in S) becomes LIR; the bottom LIR, if over C - H, becomes resident HIR."""
        s.lir.add(e)
        if len(s.lir) > self.lirs:
            bottom = next(x for x in s.s if x in s.lir)
            s.lir.discard(bottom)
            s.q[bottom] = None
        self.prune(s)

    def on_hit(self, s, e):
        if e in s.lir:
            s.s.move_to_end(e)
            self.prune(s)
        elif e in s.s:
            s.s.move_to_end(e)
            del s.q[e]
            self.promote(s, e)
        else:
            s.s[e] = None
            s.q.move_to_end(e)

    def victim(self, s, e, needed):
        hir = next((x for x in s.q if x not in needed), None)
        if hir is not None:
            return hir
        return next(x for x in s.s if x in s.lir and x not in needed)

    def on_evict(self, s, e):
        if s.q.pop(e, False) is None:
            return  # a resident HIR: S remembers it, non-resident
        s.lir.discard(e)
        del s.s[e]
        self.prune(s)

    def on_insert(self, s, e):
        if len(s.lir) < self.lirs:
            s.lir.add(e)
            s.s[e] = None
            s.s.move_to_end(e)
        elif e in s.s:
            s.s.move_to_end(e)
            self.promote(s, e)
        else:
            s.s[e] = None
            s.q[e] = None
