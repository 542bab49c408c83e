"""Segmented LRU (Karedla, Love & Wherry 1994), as libCacheSim's SLRU: `segments` LRU lists
(default 4), lowest first. A miss enters the lowest segment with room (the lowest, once
the pool is full); a hit moves an expert to the head of the next segment up (or of the top
one), and a segment over its size pushes its tail down to the head of the one below; the
victim is the tail of the lowest non-empty segment.

Sizes: libCacheSim gives each segment C // segments and leaves the remainder unused (and
admits nothing below C = segments); here the remainder goes to the lowest segments, so
the pool holds all C experts: the two agree exactly when segments divides C.

Per token: the victim is the least recent resident, lowest segment first, that the token
does not need.
"""

from collections import OrderedDict

from moecache.errors import MoecacheError
from moecache.policies.base import EventPolicy


class Segments:
    """LRU segments, lowest first, each an OrderedDict with its tail (LRU end) first."""

    def __init__(self, sizes: list[int]):
        self.sizes, self.lists, self.where = sizes, [OrderedDict() for _ in sizes], {}

    def __len__(self):
        return len(self.where)

    def put(self, e, i):
        self.lists[i][e], self.where[e] = None, i

    def remove(self, e):
        del self.lists[self.where.pop(e)][e]

    def insert(self, e):
        room = [
            i for i, (lst, n) in enumerate(zip(self.lists, self.sizes, strict=True)) if len(lst) < n
        ]
        self.put(e, room[0] if room else 0)

    def hit(self, e):
        i = min(self.where[e] + 1, len(self.lists) - 1)
        self.remove(e)
        self.put(e, i)
        while i > 0 and len(self.lists[i]) > self.sizes[i]:  # cool down, one tail a level
            x = next(iter(self.lists[i]))
            self.remove(x)
            self.put(x, i - 1)
            i -= 1

    def victim(self, needed):
        """The least recent expert not in `needed`, lowest segment first (None: none)."""
        return next((x for lst in self.lists for x in lst if x not in needed), None)


def split(total: int, parts: int) -> list[int]:
    """`total` slots in `parts` near-equal shares, the larger ones lowest."""
    return [total // parts + (i < total % parts) for i in range(parts)]


class SLRU(EventPolicy):
    name = "slru"

    def __init__(self, capacity, num_experts, top_k, segments: int = 4):
        super().__init__(capacity, num_experts, top_k)
        if segments < 1:
            raise MoecacheError(f"policy {self.name}: segments {segments} must be >= 1")
        self.segments = segments

    def new_stream(self):
        return Segments(split(self.capacity, self.segments))

    def on_hit(self, s, e):
        s.hit(e)

    def victim(self, s, e, needed):
        return s.victim(needed)

    def on_evict(self, s, e):
        s.remove(e)

    def on_insert(self, s, e):
        s.insert(e)
