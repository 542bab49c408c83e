"""The one interface every cache policy implements, for one restricted layer.

Per token t the pooled block asks `policy.plan(t, request, probs, resident)` which experts
to evict (no data moves) and which to copy in, applies that plan to its pool, and then
computes the token: with the router's own choice (`request`) when the policy is lossless,
or with the router's best `top_k` among the resident experts when `restricts` is true.
The same objects drive trace replay, so a rule's copy count is defined once.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from moecache.errors import MoecacheError

NOT_CANDIDATE = np.iinfo(np.int64).max  # sorts after every folded key
OUTSIDE = 2**62  # added to a non-resident's folded key
NONE = np.empty(0, dtype=np.int64)


@dataclass
class Plan:
    """What the pool does before token t is computed: drop `evict`, then copy in `admit`."""

    admit: list[int] = field(default_factory=list)
    evict: list[int] = field(default_factory=list)
    refresh: bool = False  # a restricting policy replaced its set here (trace: refreshed)


class Policy:
    """Base of all policies. Subclasses set `name` and take their parameters as keywords."""

    name: str = ""
    restricts: bool = False  # True: the router may choose only among resident experts
    needs_future: bool = False  # True: reset() must be given the recorded demand
    needs_probs: bool = False  # True: decides from the router's probabilities
    needs_hidden: bool = False  # True: decide(x) reads the block's input hidden state
    layer: int | None = None  # the restricted layer it serves (set by the harness)
    by_default: bool = True  # False: replayed only when named (it needs a trained file)

    def __init__(self, capacity: int, num_experts: int, top_k: int):
        if not 0 < top_k <= capacity <= num_experts:
            raise MoecacheError(
                f"policy {self.name}: need 0 < top-k {top_k} <= capacity {capacity} "
                f"<= experts {num_experts}"
            )
        self.capacity, self.num_experts, self.top_k = capacity, num_experts, top_k

    def reset(self, future: Sequence[Sequence[int]] | None = None) -> None:
        """Start a sequence with an empty pool. `future` is this layer's demand for the whole
        sequence, as recorded by an earlier run (only for rules with needs_future)."""
        if self.needs_future and future is None:
            raise MoecacheError(f"policy {self.name}: needs the demand trace of an earlier run")
        self.future = future

    def decide(self, x):
        """For needs_hidden: the policy's own computation on the block's input hidden states
        x [T, H], on the device, inside the timed step; one row per token, handed back on
        the host through see() before that token's plan."""
        raise NotImplementedError

    def see(self, row: np.ndarray) -> None:
        """The host copy of this token's row of decide()."""
        raise NotImplementedError

    def plan(
        self, t: int, request: Sequence[int], probs: np.ndarray | None, resident: AbstractSet[int]
    ) -> Plan:
        """`request`: the router's top-k for token t, in the router's order (most probable
        first); `probs`: its softmax over all experts (None for a policy that reads none,
        `needs_probs` and `restricts` false)."""
        raise NotImplementedError

    def last_use(self, t: int, width: int) -> np.ndarray:
        """Recency keys for token t's `width` requested experts, in request order:
        (1 + t) * top_k + position. Higher is more recent, and 0 (never requested) sorts
        first. This is an ordered map of last use that moves each requested expert to its
        end in request order: a later token is more recent, and of the experts one token
        requests the one requested earlier counts as less recent."""
        if width > self.top_k:
            raise MoecacheError(
                f"policy {self.name}: token {t} requests {width} experts, more than "
                f"top-k {self.top_k}"
            )
        return (1 + t) * self.top_k + np.arange(width, dtype=np.int64)

    def cache_to(self, target, resident, order=None, refresh=True) -> Plan:
        """The plan that makes `target` resident: admit what is missing, and evict residents
        outside it, first by `order` (default: the lower id), only as far as the admitted
        need room (a restricting policy's refresh)."""
        admit = [e for e in target if e not in resident]
        room = self.capacity - len(resident)
        spare = sorted(set(resident).difference(target), key=order)
        return Plan(admit=admit, evict=spare[: max(0, len(admit) - room)], refresh=refresh)


class Pools:
    """The resident sets of many streams' pools: what eviction rules see of ExpertPool.

    `base` [streams, N] holds each expert's id, pushed past every eviction key (by OUTSIDE)
    while the expert is not resident, so sorting `key * N + base` puts the residents
    first, in key order.
    """

    def __init__(self, streams: int, num_experts: int, capacity: int):
        self.num_experts, self.capacity = num_experts, capacity
        self.base = np.tile(np.arange(num_experts) + OUTSIDE, (streams, 1))
        self.count = np.zeros(streams, dtype=np.int64)

    @classmethod
    def holding(cls, resident, num_experts: int, capacity: int) -> Pools:
        """One pool holding the experts in `resident`."""
        pools = cls(1, num_experts, capacity)
        ids = np.fromiter(resident, dtype=np.int64)
        pools.base[0, ids], pools.count[0] = ids, len(ids)
        return pools

    @property
    def resident(self) -> np.ndarray:
        return self.base < OUTSIDE

    def apply(self, n: int, plan: StepPlan) -> None:
        """Evict the plan's victims, then copy in its misses, in the first n streams."""
        self.base.put(plan.victims, plan.victims % self.num_experts + OUTSIDE)
        admit = plan.at[plan.miss]
        self.base.put(admit, admit % self.num_experts)
        # Victims are only taken to make room, so a pool grows until full, then stays full.
        np.minimum(self.count[:n] + plan.copies, self.capacity, out=self.count[:n])


class StepPlan(NamedTuple):
    """What one step of token t does in the first n streams' pools, from
    EvictionPolicy.step: which requests miss and which residents make room for them."""

    at: np.ndarray  # [n, k] flat indices (row * N + expert) of the requested experts
    miss: np.ndarray  # [n, k] True where the expert must be copied in
    copies: np.ndarray  # [n] misses per stream
    victims: np.ndarray  # flat indices of the experts evicted to make room


class EvictionPolicy(Policy):
    """Lossless: every requested expert is copied in at once; the rule only picks the
    victims, among residents the current token does not need.

    A rule is two methods over state arrays shaped [streams, N]: `priority` ranks the
    experts (lowest evicted first) and `observe` learns from each token after its victims
    are chosen. The harness drives one stream through `plan`; trace replay drives many
    streams at once through `step`, so a rule's copy count is defined once. At token t the
    streams still running are the first n rows (`rows` = slice(0, n)), and `at` [n, k]
    holds the flat indices (row * N + expert) of the experts each requests, for np.take
    and np.put on any state array.
    """

    def reset(self, future=None, streams: int = 1) -> None:
        super().reset(future)
        self.start = np.arange(streams)[:, None] * self.num_experts  # flat index of each row
        # Each expert's last_use key (0: never requested), so that it is itself the LRU
        # key: (1 + t) * top_k + its position in the request of t, its last token.
        self.recency = np.zeros((streams, self.num_experts), dtype=np.int64)

    def priority(self, t: int, rows: slice, probs):
        """Eviction order of the experts of the streams in `rows`: one non-negative integer
        key per expert ([n, N], below 2**40; lower goes first, ties to the lower id), or a
        tuple of such arrays of any dtype, most significant first (slower)."""
        raise NotImplementedError

    def observe(self, t: int, rows: slice, at: np.ndarray, probs) -> None:
        """Learn from token t after its victims are chosen (default: recency). `at` keeps
        each stream's request order, which orders the token's experts by recency."""
        self.recency.put(at, np.broadcast_to(self.last_use(t, at.shape[1]), at.shape))

    def step(self, t: int, at: np.ndarray, probs, pools: Pools) -> StepPlan:
        """Plan token t for the first n = len(at) streams, given the flat indices `at`
        [n, k] of their requests and the router's `probs` [n, N] (or None)."""
        n = len(at)
        rows = slice(0, n)
        miss = pools.base.take(at) >= OUTSIDE
        copies = miss.sum(axis=1)
        need = pools.count[:n] + copies - self.capacity
        most = need.max(initial=0)
        victims = NONE
        if most > 0:
            order = self.eviction_order(t, rows, at, probs, pools, most)
            victims = order[np.arange(most) < need[:, None]]
        self.observe(t, rows, at, probs)
        return StepPlan(at, miss, copies, victims)

    def eviction_order(self, t, rows, at, probs, pools, most: int) -> np.ndarray:
        """The `most` first victims per stream, as flat indices, in `priority` order
        (residents only; the current token's experts never)."""
        keys = self.priority(t, rows, probs)
        n, start = self.num_experts, self.start[rows]
        if isinstance(keys, np.ndarray):
            folded = keys * n + pools.base[rows]  # sorting values beats argsort severalfold
            folded.put(at, NOT_CANDIDATE)
            return np.sort(folded, axis=1)[:, :most] % n + start
        blocked = pools.base[rows] >= OUTSIDE
        blocked.put(at, True)
        ids = np.broadcast_to(np.arange(n), blocked.shape)
        return np.lexsort((ids, *reversed(keys), blocked), axis=-1)[:, :most] + start

    def plan(self, t, request, probs, resident) -> Plan:
        pools = Pools.holding(resident, self.num_experts, self.capacity)
        probs = None if probs is None else np.asarray(probs)[None]
        step = self.step(t, np.asarray([request]), probs, pools)
        admit = [int(e) for e, m in zip(request, step.miss[0], strict=True) if m]
        return Plan(admit=admit, evict=sorted(step.victims.tolist()))

    def least_recent(self, rows: slice) -> np.ndarray:
        """The LRU key: never-used experts first, then by last use; experts last used by
        the same token in their order in its request (see last_use)."""
        return self.recency[rows]


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
        self.states = [self.new_stream() for _ in range(streams)]

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

    def step(self, t: int, at: np.ndarray, probs, pools: Pools) -> StepPlan:
        n, width = len(at), self.num_experts
        miss = pools.base.take(at) >= OUTSIDE
        requests = (at - self.start[:n]).tolist()
        victims = []
        for row, (request, missed) in enumerate(zip(requests, miss.tolist(), strict=True)):
            s, needed = self.states[row], frozenset(request)
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
        return StepPlan(at, miss, miss.sum(axis=1), np.array(victims, dtype=np.int64))


class ScheduledPolicy(Policy):
    """Restricting: the cache changes only at scheduled refreshes, which copy just the
    experts not yet resident; between them nothing is copied and the router chooses
    among the resident experts."""

    restricts = True

    def reset(self, future=None) -> None:
        super().reset(future)
        # Each expert's last_use key (0: never requested); last_request // top_k - 1 is
        # the token of its last request.
        self.last_request = np.zeros(self.num_experts, dtype=np.int64)

    def plan(self, t, request, probs, resident) -> Plan:
        self.observe(t, request)
        self.last_request[list(request)] = self.last_use(t, len(request))
        if not self.due(t):
            return Plan()
        # Residents outside the target leave least recently requested first (one token's
        # experts in request order, as for LRU).
        return self.cache_to(self.target(t), resident, lambda e: (self.last_request[e], e))

    def observe(self, t: int, request: Sequence[int]) -> None:
        """Record token t's demand (the router's unrestricted top-k)."""

    def due(self, t: int) -> bool:
        raise NotImplementedError

    def target(self, t: int) -> list[int]:
        """The experts the refresh at token t makes resident (at most `capacity`)."""
        raise NotImplementedError
