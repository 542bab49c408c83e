"""The resident sets of many streams' pools, as eviction rules see them, and what one step
of a rule does to them (StepChange)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

OUTSIDE = 2**62  # added to a non-resident's folded key
NONE = np.empty(0, dtype=np.int64)


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

    def apply(self, n: int, plan: StepChange) -> None:
        """Evict the plan's victims, then copy in its misses, in the first n streams."""
        self.base.put(plan.victims, plan.victims % self.num_experts + OUTSIDE)
        admit = plan.at[plan.miss]
        self.base.put(admit, admit % self.num_experts)
        # Victims are only taken to make room, so a pool grows until full, then stays full.
        np.minimum(self.count[:n] + plan.copies, self.capacity, out=self.count[:n])


class StepChange(NamedTuple):
    """What one step of token t does in the first n streams' pools, from
    EvictionPolicy.step: which requests miss and which residents make room for them."""

    at: np.ndarray  # [n, k] flat indices (row * N + expert) of the requested experts
    miss: np.ndarray  # [n, k] True where the expert must be copied in
    copies: np.ndarray  # [n] misses per stream
    victims: np.ndarray  # flat indices of the experts evicted to make room
