"""What the tiered block moves at each token, decided as it decodes (docs/tiers.md).

The device tier holds C experts under a ranked eviction rule; its admission is `always`
(every miss copied in) or `bypass` (a miss copied in only into a free slot or in place of a
victim it is predicted back sooner than; the rest computed on the host). The host tier
holds H experts under its own rule, serves each token's device misses as one request and
reads from disk what it lacks. Causal only: the prediction is recency, and neither rule may
read the future (a decode does not know it; farthest-future would need a recorded trace).
Admission is decided by policies/admission.py, as in the replay of the same schedule from
recorded demand (replay/tiers.py); tests/test_tiers_harness.py checks both count the same.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from moecache import policies
from moecache.errors import MoecacheError
from moecache.policies import EvictionPolicy
from moecache.policies.admission import ADMISSIONS, Recency, device_step
from moecache.policies.pools import Pools
from moecache.records import counting


class Moves(NamedTuple):
    """One token's moves in one layer, expert ids as ints."""

    copied: list  # copied host to device (admitted)
    computed: list  # device misses computed on the host (bypass only)
    evicted: list  # device victims
    read: list  # read from disk into the host (host tier only)
    dropped: list  # host victims


def causal_rule(name: str, capacity: int, num_experts: int, top_k: int) -> EvictionPolicy:
    """A ranked eviction rule that needs neither the future nor router probabilities."""
    policy = policies.make(name, capacity, num_experts, top_k, {})
    if not isinstance(policy, EvictionPolicy) or policy.needs_future or policy.needs_probs:
        raise MoecacheError(
            f"harness.tiers rule {name}: the tiered harness runs ranked rules that read only "
            "past requests (lru, decayed-frequency, ...)"
        )
    return policy


class DeviceTier:
    """C experts of one layer; `decide` returns what token t copies in, computes on the
    host and evicts, and updates the resident set."""

    def __init__(self, policy: EvictionPolicy, admission: str):
        if admission not in ADMISSIONS:
            raise MoecacheError(f"harness.tiers admission {admission}: known are always, bypass")
        self.policy, self.bypass = policy, admission == "bypass"
        self.reset()

    def reset(self) -> None:
        self.policy.reset(None, streams=1)
        self.pools = Pools(1, self.policy.num_experts, self.policy.capacity)
        self.recency = Recency(self.policy.num_experts)
        self.been_full = False

    def fill(self) -> None:
        """Every slot taken (the all-resident reference: C = N, nothing ever moves)."""
        n = self.policy.num_experts
        self.pools = Pools.holding(range(n), n, self.policy.capacity)

    def decide(self, t: int, request: list[int]) -> tuple[list, list, list, bool]:
        """(copied, computed, evicted, whether the pool had been full before token t)."""
        at = np.asarray(request, dtype=np.int64)[None]
        plan, misses = device_step(self.policy, t, at, None, self.pools, self.bypass, self.recency)
        full_before = self.been_full
        self.pools.apply(1, plan)
        count = self.pools.count[0]
        self.been_full = bool(counting.has_been_full(full_before, count, self.policy.capacity))
        taken = set(plan.at[plan.miss].tolist())
        copied = [e for e in at[0].tolist() if e in taken]  # in request order, as decoded
        computed = [e for e in misses.tolist() if e not in taken]
        return copied, computed, np.asarray(plan.victims).tolist(), full_before


class HostTier:
    """H experts of one layer over the disk: one request per token with device misses, in
    the host's own clock; everything it lacks is read."""

    def __init__(self, policy: EvictionPolicy):
        self.policy = policy
        self.reset()

    def reset(self) -> None:
        self.policy.reset(None, streams=1)
        self.pools = Pools(1, self.policy.num_experts, self.policy.capacity)
        self.clock = 0

    def decide(self, misses: list[int]) -> tuple[list, list]:
        """(read from disk, dropped) for one token's device misses."""
        if not misses:
            return [], []
        at = np.asarray(misses, dtype=np.int64)[None]
        plan = self.policy.step(self.clock, at, None, self.pools)
        self.pools.apply(1, plan)
        self.clock += 1
        return at[plan.miss].tolist(), np.asarray(plan.victims).tolist()


class LayerTiers:
    """Both tiers of one layer (host None: every expert in host memory, no disk)."""

    def __init__(self, device: DeviceTier, host: HostTier | None):
        self.device, self.host = device, host

    def reset(self) -> None:
        self.device.reset()
        if self.host is not None:
            self.host.reset()

    def decide(self, t: int, request: list[int]) -> tuple[Moves, bool]:
        copied, computed, evicted, full_before = self.device.decide(t, request)
        read, dropped = [], []
        if self.host is not None:
            # Every device miss, copied or computed, is read from host memory.
            wanted = [e for e in request if e in set(copied) or e in set(computed)]
            read, dropped = self.host.decide(wanted)
        return Moves(copied, computed, evicted, read, dropped), full_before
