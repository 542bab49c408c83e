"""Every expert resident (C = N): the pool is filled once per sequence, nothing is evicted."""

from moecache.errors import MoecacheError
from moecache.policies.policy import Policy, PoolChange


class AllResident(Policy):
    name = "all"

    def __init__(self, capacity, num_experts, top_k):
        super().__init__(capacity, num_experts, top_k)
        if capacity != num_experts:
            raise MoecacheError(
                f"policy all: capacity {capacity} must equal the expert count {num_experts}"
            )

    def change(self, t, request, probs, resident):
        if len(resident) == self.num_experts:  # every token after the first
            return PoolChange()
        return PoolChange(admit=[e for e in range(self.num_experts) if e not in resident])
