"""S3-FIFO (Yang et al., SOSP 2023), as libCacheSim's S3FIFO: a small FIFO S (int(C * 0.1)
slots), a main FIFO M (the rest) with a 2-bit CLOCK counter, and a ghost FIFO G of ids
(int(C * 0.9)). A hit adds 1 to an expert's counter. A miss remembered in G enters M,
any other miss S (M, while nothing has been evicted yet and S is full). To evict: from M
when M is above its share or S is empty, else from S. From S: the oldest goes to M
(counter 0) if it was hit at least `threshold` (2) times, else it is evicted into G. From
M: the oldest is reinserted at the head with min(count, 3) - 1 if its count is above 0,
else evicted. Repeat until one expert is evicted.

libCacheSim admits no new object while S has fewer than 2 slots (C < 20); here every
miss is admitted. Per token: S and M yield their oldest experts the token does not need;
the token's own stay where they are, counts kept.
"""

from collections import OrderedDict
from types import SimpleNamespace

from moecache.errors import MoecacheError
from moecache.policies.base import EventPolicy


class S3FIFO(EventPolicy):
    name = "s3-fifo"

    def __init__(
        self,
        capacity,
        num_experts,
        top_k,
        small: float = 0.1,
        ghost: float = 0.9,
        threshold: int = 2,
    ):
        super().__init__(capacity, num_experts, top_k)
        if not (0 <= small < 1 and ghost >= 0 and threshold >= 1):
            raise MoecacheError(
                f"policy {self.name}: need 0 <= small < 1, ghost >= 0, threshold >= 1"
            )
        self.small, self.ghost = int(capacity * small), int(capacity * ghost)
        self.main, self.threshold = capacity - self.small, threshold

    def new_stream(self):
        # s, m: expert -> counter, oldest first; g: ghost ids, oldest first
        return SimpleNamespace(
            s=OrderedDict(), m=OrderedDict(), g=OrderedDict(), seen=False, evicted=False
        )

    def on_hit(self, s, e):
        q = s.s if e in s.s else s.m
        q[e] += 1

    def on_miss(self, s, e):
        s.seen = s.g.pop(e, False) is None

    def victim(self, s, e, needed):
        s.evicted = True
        while True:  # one libCacheSim eviction round: from M, or from S until one goes
            small = [x for x in s.s if x not in needed]
            main = any(x not in needed for x in s.m)
            if main and (len(s.m) > self.main or not small):
                while True:
                    x = next(x for x in s.m if x not in needed)
                    if s.m[x] == 0:
                        return x
                    s.m[x] = min(s.m.pop(x), 3) - 1
            for x in small:
                if s.s[x] < self.threshold:
                    return x
                del s.s[x]
                s.m[x] = 0

    def on_evict(self, s, e):
        if s.m.pop(e, None) is not None:
            return
        del s.s[e]
        if self.ghost:
            s.g[e] = None
            if len(s.g) > self.ghost:
                s.g.popitem(last=False)

    def on_insert(self, s, e):
        into_main = s.seen or (not s.evicted and len(s.s) >= self.small)
        (s.m if into_main else s.s)[e] = 0
