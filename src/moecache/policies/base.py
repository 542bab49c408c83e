"""The one interface every cache policy implements, for one restricted layer.

Per token t the pooled block asks `policy.plan(t, request, probs, resident)` which experts
to evict (no data moves) and which to copy in, applies that plan to its pool, and then
computes the token: with the router's own choice (`request`) when the policy is lossless,
or with the router's best `top_k` among the resident experts when `restricts` is true.
The same objects drive trace replay, so a rule's copy count is defined once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from moecache.errors import MoecacheError


@dataclass
class Plan:
    """What the pool does before token t is computed: drop `evict`, then copy in `admit`."""

    admit: list[int] = field(default_factory=list)
    evict: list[int] = field(default_factory=list)


class Policy:
    """Base of all policies. Subclasses set `name` and take their parameters as keywords."""

    name: str = ""
    restricts: bool = False  # True: the router may choose only among resident experts
    needs_future: bool = False  # True: reset() must be given the recorded demand

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

    def plan(
        self, t: int, request: Sequence[int], probs: np.ndarray, resident: frozenset[int]
    ) -> Plan:
        """`request`: the router's top-k for token t; `probs`: its softmax over all experts."""
        raise NotImplementedError


class EvictionPolicy(Policy):
    """Lossless: every requested expert is copied in at once; the rule only picks each
    victim among residents the current token does not need."""

    def reset(self, future=None) -> None:
        super().reset(future)
        self.last_use = np.full(self.num_experts, -1, dtype=np.int64)

    def plan(self, t, request, probs, resident) -> Plan:
        misses = [e for e in request if e not in resident]
        room = self.capacity - len(resident)
        candidates = set(resident).difference(request)
        evict = []
        for _ in range(len(misses) - room):
            victim = self.victim(t, sorted(candidates), probs)
            candidates.remove(victim)
            evict.append(victim)
        self.observe(t, request, probs)
        return Plan(admit=misses, evict=evict)

    def victim(self, t: int, candidates: list[int], probs: np.ndarray) -> int:
        """The resident to evict; `candidates` (sorted ids) never holds a requested expert."""
        raise NotImplementedError

    def observe(self, t: int, request: Sequence[int], probs: np.ndarray) -> None:
        """Learn from token t after its victims are chosen (default: recency)."""
        self.last_use[list(request)] = t

    def least_recent(self, candidates: list[int]) -> int:
        """LRU among `candidates`; ties (never used) go to the lowest id."""
        return min(candidates, key=lambda e: (self.last_use[e], e))


class ScheduledPolicy(Policy):
    """Restricting: the cache changes only at scheduled refreshes, which copy just the
    experts not yet resident; between them nothing is copied and the router chooses
    among the resident experts."""

    restricts = True

    def reset(self, future=None) -> None:
        super().reset(future)
        self.last_request = np.full(self.num_experts, -1, dtype=np.int64)

    def plan(self, t, request, probs, resident) -> Plan:
        self.observe(t, request)
        self.last_request[list(request)] = t
        if not self.due(t):
            return Plan()
        target = self.target(t)
        admit = [e for e in target if e not in resident]
        room = self.capacity - len(resident)
        # Make room by dropping residents outside the target, least recently requested first.
        spare = sorted(set(resident).difference(target), key=lambda e: (self.last_request[e], e))
        return Plan(admit=admit, evict=spare[: max(0, len(admit) - room)])

    def observe(self, t: int, request: Sequence[int]) -> None:
        """Record token t's demand (the router's unrestricted top-k)."""

    def due(self, t: int) -> bool:
        raise NotImplementedError

    def target(self, t: int) -> list[int]:
        """The experts the refresh at token t makes resident (at most `capacity`)."""
        raise NotImplementedError
