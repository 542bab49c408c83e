"""What the tiered block moves at each token, decided as it decodes (docs/tiers.md).

The device tier holds C experts under a ranked eviction rule; its admission is `always`
(every miss copied in) or `bypass` (a miss copied in only into a free slot or in place of a
victim it is predicted back sooner than; the rest computed on the host). The host tier
holds H experts under its own rule, serves each token's device misses as one request and
reads from disk what it lacks. Causal only: the prediction is recency, and neither rule may
read the future (a decode does not know it; farthest-future would need a recorded trace).
The replay counts the same schedule from recorded demand (replay/tiers.py); the harness may
not import it, so tests/test_tiers_harness.py checks both count the same.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from moecache import policies
from moecache.errors import MoecacheError
from moecache.policies import EvictionPolicy
from moecache.policies.pools import NONE, OUTSIDE, Pools, StepPlan
from moecache.records import counting

ADMISSIONS = ("always", "bypass")


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
        self.last_use = np.full(self.policy.num_experts, -1, dtype=np.int64)  # -1: never
        self.been_full = False

    def fill(self) -> None:
        """Every slot taken (the all-resident reference: C = N, nothing ever moves)."""
        n = self.policy.num_experts
        self.pools = Pools.holding(range(n), n, self.policy.capacity)

    def decide(self, t: int, request: list[int]) -> tuple[list, list, list, bool]:
        """(copied, computed, evicted, whether the pool had been full before token t)."""
        at = np.asarray(request, dtype=np.int64)[None]
        absent = self.pools.base[0, at[0]] >= OUTSIDE
        misses = at[0][absent]
        if self.bypass:
            plan = self.admit_sooner(t, at, misses)
        else:
            plan = self.policy.step(t, at, None, self.pools)
        self.last_use[at[0]] = t
        full_before = self.been_full
        self.pools.apply(1, plan)
        count = self.pools.count[0]
        self.been_full = bool(counting.has_been_full(full_before, count, self.policy.capacity))
        copied = at[plan.miss].tolist()
        computed = [e for e in misses.tolist() if e not in set(copied)]
        return copied, computed, np.asarray(plan.victims).tolist(), full_before

    def admit_sooner(self, t: int, at: np.ndarray, misses: np.ndarray) -> StepPlan:
        """Bypass: misses most recently used first take the free slots; each further one
        takes the rule's next victim only if used more recently than it (a never-used
        expert displaces no one); the first refusal sends it and the rest to the host."""
        recency = self.last_use  # higher: predicted back sooner
        ranked = sorted(misses.tolist(), key=lambda e: -recency[e])
        free = self.policy.capacity - int(self.pools.count[0])
        waiting, victims = ranked[free:], []
        if waiting:
            order = self.policy.eviction_order(t, slice(0, 1), at, None, self.pools, len(waiting))
            for e, victim in zip(waiting, order[0].tolist(), strict=False):
                if not recency[e] > recency[victim]:
                    break
                victims.append(victim)
        self.policy.learn(t, slice(0, 1), at, None)
        taken = set(ranked[: free + len(victims)])
        miss = np.array([[e in taken for e in at[0].tolist()]])
        kept = np.asarray(victims, dtype=np.int64) if victims else NONE
        return StepPlan(at, miss, np.array([len(taken)]), kept)


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
