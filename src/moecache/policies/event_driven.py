"""Lossless eviction rules that react to events, per stream (EventPolicy)."""

from __future__ import annotations

import numpy as np

from moecache.errors import MoecacheError
from moecache.policies.eviction import EvictionPolicy
from moecache.policies.pools import OUTSIDE, Pools, StepChange


class EventPolicy(EvictionPolicy):
    """Lossless, per stream: a rule that reacts to events instead of ranking all experts.

    Replay calls `step` for many streams at once, as for every EvictionPolicy; here it loops
    over them in Python. Per stream, token t's requested experts split into hits and misses,
    and the rule hears, in this order:

    1. `on_hit(s, e)` for every hit, in request order;
    2. for every miss, in request order: `on_miss(s, e)`; then, only if the pool is full,
       `victim(s, e, needed)` picks one resident to make room for e and `on_evict(s, v)`
       drops it; then `on_insert(s, e)`.

    So a token is its experts requested one after another (hits first), except that none of
    them may be evicted for another: `needed` (the token's experts) is never a valid
    victim, and `step` refuses one. `s` is the stream's own state, made by `new_stream()`
    at `reset`. The pool grows until full and then stays full: one eviction per miss.
    """

    def reset(self, future=None, streams: int = 1) -> None:
        super().reset(future, streams)
        self.state = self.new_state(streams)

    def new_state(self, streams: int):
        """Every stream's state: here one `new_stream()` per stream, indexed by row (a
        compiled rule keeps them all in arrays instead, kernels.py)."""
        return [self.new_stream() for _ in range(streams)]

    def new_stream(self):
        """A fresh stream's state (queues, counters), handed to every hook as `s`."""
        raise NotImplementedError

    def on_hit(self, s, e: int) -> None:
        """Expert e, resident, is requested."""

    def on_miss(self, s, e: int) -> None:
        """Expert e, not resident, is requested; room is made for it next (ghost lookups)."""

    def victim(self, s, e: int, needed: frozenset[int]) -> int:
        """The resident to evict so that e fits: never one in `needed`. May reorganise the
        rule's structures on the way (move a hand, clear bits, demote between queues)."""
        raise NotImplementedError

    def on_evict(self, s, e: int) -> None:
        """Expert e leaves the pool."""

    def on_insert(self, s, e: int) -> None:
        """Expert e enters the pool."""

    def step(self, t: int, at: np.ndarray, probs, pools: Pools) -> StepChange:
        n, width = len(at), self.num_experts
        miss = pools.base.take(at) >= OUTSIDE
        requests = (at - self.start[:n]).tolist()
        victims = []
        for row, (request, missed) in enumerate(zip(requests, miss.tolist(), strict=True)):
            s, needed = self.state[row], frozenset(request)
            for e, m in zip(request, missed, strict=True):
                if not m:
                    self.on_hit(s, e)
            free, gone = self.capacity - int(pools.count[row]), set()
            for e, m in zip(request, missed, strict=True):
                if not m:
                    continue
                self.on_miss(s, e)
                if free > 0:
                    free -= 1
                else:
                    v = self.victim(s, e, needed)
                    if v in needed or v in gone or pools.base[row, v] >= OUTSIDE:
                        raise MoecacheError(f"policy {self.name}: invalid victim {v} at token {t}")
                    gone.add(v)
                    self.on_evict(s, v)
                    victims.append(row * width + v)
                self.on_insert(s, e)
        return StepChange(at, miss, miss.sum(axis=1), np.array(victims, dtype=np.int64))
