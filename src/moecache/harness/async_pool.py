"""An expert pool whose copies run beside the compute (copy_engine.py), with prefetching.

Same slots and kernel as the blocking ExpertPool; `apply(change)` submits the change's copies
and returns, and the block waits on an expert (`wait`) right before computing with it.
`prefetch(experts, deadline, victims)` asks for copies ahead of demand; the eviction rule
names the victims (`victims`), never among the protected experts: those the current token
needs and those in flight. In flight means copied for a token not yet over (a demand copy
until the compute waited on it, a prefetch until used or until its last token has passed),
a set that depends on the decoding alone, never on how fast the copies ran, so that the
counts repeat exactly. Evicting a protected expert is refused; evicting one whose copy may
still be running waits for it first (a slot is reused only once its copy has landed).

Counts, per sequence: demand and prefetch copies, prefetches used by a token before their
eviction or deadline, prefetches wasted (evicted, or left unused), the seconds the compute
stalled on copies, the copy seconds hidden under compute, and the block's own seconds; and,
for the overlap cost model, the experts computed and each token's demand group: how many
copies it made on demand and how many experts the compute finished before it waited on the
last of them (`count_demand`), counts that depend on the decoding alone.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable, Collection

import torch

from moecache.errors import MoecacheError
from moecache.harness.pool import ExpertPool, HostExperts
from moecache.harness.timing import Lap
from moecache.policies import PoolChange

CALIBRATION_COPIES = 4  # distinct experts per group timed for this machine's copy time

# victims(protected, count): up to `count` residents outside `protected`, by the rule.
Victims = Callable[[set, int], list]


class AsyncExpertPool(ExpertPool):
    def __init__(self, host: HostExperts, capacity: int, multiplier: int, link, engine):
        self.engine = engine
        self.tickets_of: dict = {}  # expert -> the ticket of a copy not yet waited on
        self.in_flight: dict = {}  # expert -> the last token its copy is for
        self.prefetched: dict = {}  # expert -> deadline, a prefetch not yet used
        self.needed: frozenset = frozenset()
        self.token = 0  # the token being decoded (begin)
        super().__init__(host, capacity, multiplier, link)
        engine.calibrate(host.expert_bytes, self.blocking_group)

    def reset(self) -> None:
        """An empty pool for a new sequence, once every copy has landed (not counted)."""
        for ticket in self.tickets_of.values():
            self.engine.wait(ticket).seconds()
        self.tickets_of, self.in_flight, self.prefetched = {}, {}, {}
        super().reset()

    def clear_counts(self) -> None:
        super().clear_counts()
        self.demand_copies = self.prefetch_copies = 0
        self.prefetch_used = self.prefetch_wasted = 0
        # The compute's waits on copies: the laps the blocking pool's rows read as copy time.
        self.stalls: list[Lap] = self.laps
        self.tickets = list(self.tickets_of.values())  # every copy counted, for its time
        self.spans: list[Lap] = []  # the block's own time per token
        self.prefetched = {}  # those left from before count neither as used nor as wasted
        self.experts_computed = 0
        self.demand_groups: Counter = Counter()  # (copies, experts computed before) -> tokens

    def begin(self, t: int, request, needed: Collection[int]) -> None:
        """Token t requests `request`; `needed` are protected until `end(t)`."""
        self.token, self.needed = t, frozenset(needed)
        for e in request:
            if self.prefetched.pop(e, None) is not None:
                self.prefetch_used += 1

    def end(self, t: int) -> None:
        """Token t is over: copies for it (or earlier) are no longer in flight."""
        self.needed = frozenset()
        for e in [e for e, last in self.in_flight.items() if last <= t]:
            del self.in_flight[e]
        for e in [e for e, last in self.prefetched.items() if last <= t]:
            del self.prefetched[e]
            self.prefetch_wasted += 1

    def settle(self, experts) -> None:
        """The compute waits for whichever of `experts` are in flight (a victim the rule
        chose without knowing), so that they may be evicted."""
        for e in experts:
            if e in self.in_flight:
                self.wait(e)

    def apply(self, change: PoolChange) -> None:
        self.evict(change.evict)
        self.submit(change.admit, deadline=None)

    def prefetch(self, experts, deadline: int, victims: Victims) -> None:
        """Copy `experts` (in this order, as many as room allows) for tokens up to
        `deadline`, evicting what `victims` names."""
        wanted = list(dict.fromkeys(experts))[: self.capacity]
        missing = [e for e in wanted if e not in self.slot_of]
        short = len(missing) - len(self.free)
        if short > 0:
            chosen = victims(self.protected() | set(wanted), short)
            self.evict(chosen)
            missing = missing[: len(self.free)]
        self.submit(missing, deadline)

    def count_demand(self, admitted, used, waits_first: bool) -> None:
        """Token's demand copies `admitted` and its experts `used`, in the order the compute
        takes them: the experts computed before the compute waits on the last expert copied
        for it are the compute its copies can hide under. A kernel that waits for every
        expert first (`waits_first`) hides none; copies the token does not use (a refresh's
        other experts) are waited on only when the token ends: all of its experts."""
        self.experts_computed += len(used)
        if not admitted:
            return
        copied = set(admitted)
        waits = [i for i, e in enumerate(used) if e in copied]
        before = len(used) if not waits else 0 if waits_first else waits[-1]
        self.demand_groups[(len(admitted), before)] += 1

    def protected(self) -> set:
        return set(self.needed) | set(self.in_flight)

    def evict(self, victims) -> None:
        absent = sorted(set(victims).difference(self.slot_of))
        if absent:
            raise MoecacheError(f"pool: cannot evict expert(s) {absent}, not resident")
        refused = sorted(set(victims) & self.protected())
        if refused:
            raise MoecacheError(
                f"pool: refused to evict expert(s) {refused}, needed by the current token "
                "or in flight"
            )
        for e in victims:
            if e in self.tickets_of:  # its slot is reused only once its copy has landed
                self.wait(e)
            self.free.append(self.slot_of.pop(e))
            if self.prefetched.pop(e, None) is not None:
                self.prefetch_wasted += 1

    def submit(self, experts, deadline: int | None) -> None:
        """Queue copies of `experts`: on demand (deadline None) or prefetched."""
        if not experts:
            return
        for e in experts:
            slot = self.free.pop()
            self.slot_of[e] = slot
            ticket = self.engine.submit(e, functools.partial(self.copy, e, slot))
            self.tickets_of[e] = ticket
            self.tickets.append(ticket)
            self.in_flight[e] = self.token if deadline is None else deadline
            if deadline is not None:
                self.prefetched[e] = deadline
        if deadline is None:
            self.demand_copies += len(experts)
        else:
            self.prefetch_copies += len(experts)
        self.count_insertions(len(experts))  # one group, counted as the blocking pool counts

    def copy(self, e: int, slot: int) -> None:
        # One call for the expert's tensors: one GIL release and one retake, not one each.
        host = self.host
        names = list(host.slots)
        torch._foreach_copy_(
            [host.slots[n][slot] for n in names],
            [host.host[n][e] for n in names],
            non_blocking=host.pinned,
        )

    def blocking_group(self, i: int) -> float:
        """Seconds per copy of the i-th group of distinct experts, copied as the blocking
        pool copies a group (pool.py's apply) into free slots before any use."""
        host, size = self.host, min(CALIBRATION_COPIES, self.capacity)
        experts = [(i * size + j) % host.num_experts for j in range(size)]
        started = time.perf_counter()
        for e, slot in zip(experts, reversed(self.free), strict=False):
            host.load(e, slot)
        return (time.perf_counter() - started) / size

    def wait(self, e: int) -> None:
        """Right before expert `e` is used: wait for its copy, the wait counted as stall."""
        self.in_flight.pop(e, None)
        ticket = self.tickets_of.pop(e, None)
        if ticket is not None:
            self.stalls.append(self.engine.wait(ticket))

    def drain(self) -> None:
        """The token is over: wait for every copy still running, the wait counted as stall,
        so that no copy of this arm runs hidden under another arm's token (arms decoded token
        by token beside it). What is in flight is unchanged: the counts do not depend on it."""
        for ticket in self.tickets_of.values():
            self.stalls.append(self.engine.wait(ticket))
        self.tickets_of = {}

    def counts(self) -> dict:
        """This sequence's counts, once every copy has landed (the waits here not counted)."""
        for ticket in self.tickets_of.values():
            self.engine.wait(ticket).seconds()
        stall = sum(lap.seconds() for lap in self.stalls)
        busy = sum(ticket.seconds() for ticket in self.tickets)
        return {
            "demand_copies": self.demand_copies,
            "prefetch_copies": self.prefetch_copies,
            "prefetch_used": self.prefetch_used,
            # Those still unused at the end of the sequence are wasted too.
            "prefetch_wasted": self.prefetch_wasted + len(self.prefetched),
            "stall_seconds": stall,
            # While the compute stalls the copy engine is busy, so the rest is hidden.
            "hidden_copy_seconds": max(0.0, busy - stall),
            "block_seconds": sum(lap.seconds() for lap in self.spans),
            "experts_computed": self.experts_computed,
            "demand_groups": [[d, j, n] for (d, j), n in sorted(self.demand_groups.items())],
        }
