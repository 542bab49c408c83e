"""SIEVE (Zhang et al., NSDI 2024), as libCacheSim's Sieve: a FIFO queue of residents with a
visited bit (set by a hit, clear on insertion) and a hand that moves from old to new,
wrapping to the oldest. To evict, the hand clears visited bits until it finds a clear
one, evicts that expert and stays where it was, pointing at the next newer one.

Per token: the hand passes over the token's own experts untouched, so none of them is
evicted for another (their visited bit survives).
"""

from types import SimpleNamespace

from moecache.policies.base import EventPolicy


class Sieve(EventPolicy):
    name = "sieve"

    def new_stream(self):
        # queue: residents, oldest first; hand: index into it (len(queue): wrap to oldest)
        return SimpleNamespace(queue=[], visited={}, hand=0)

    def on_hit(self, s, e):
        s.visited[e] = True

    def victim(self, s, e, needed):
        i = s.hand
        while True:
            if i >= len(s.queue):
                i = 0
            x = s.queue[i]
            if x not in needed:
                if not s.visited[x]:
                    s.hand = i
                    return x
                s.visited[x] = False
            i += 1

    def on_evict(self, s, e):
        i = s.queue.index(e)
        del s.queue[i], s.visited[e]
        if i < s.hand:
            s.hand -= 1
        if s.hand >= len(s.queue):  # evicted the newest: the hand wraps to the oldest
            s.hand = 0

    def on_insert(self, s, e):
        s.queue.append(e)
        s.visited[e] = False
