"""The per-token schedule of the two tiers under the device, written once (docs/tiers.md):
the tiered replay runs it over recorded demand (replay/tiers.py), the tiered harness while
it decodes (harness/tier_runs.py, tier_block.py); tests/test_tiers_harness.py checks both
count the same.

- `DeviceTier`: the C experts of one stream's device under a ranked eviction rule, with
  admission `always` (every miss copied in) or `bypass` (a miss copied in only into a free
  slot or in place of a victim it is predicted back sooner than; the rest computed on the
  host: policies/admission.py);
- `HostTier`: the H experts of host memory over the disk under its own rule, serving each
  token's device misses (copied or computed) as one request, in its own clock, and reading
  from disk what it lacks; it starts empty.

What may be read of the future is the one difference, a parameter: a tier reset with the
stream's whole demand (the replay) lets a rule that reads the future read it, and the
device predicts a bypass by the true next use (`TrueNextUse`); reset without (the harness:
a decode does not know it), the prediction is recency and such a rule is refused.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from moecache.errors import MoecacheError
from moecache.policies.admission import ADMISSIONS, Recency, TrueNextUse, device_step
from moecache.policies.eviction import EvictionPolicy
from moecache.policies.pools import Pools, StepChange
from moecache.records import counting
from moecache.records.batch import future


class Moves(NamedTuple):
    """One token's moves in one layer, expert ids as ints."""

    copied: list  # copied host to device (admitted)
    computed: list  # device misses computed on the host (bypass only)
    evicted: list  # device victims
    read: list  # read from disk into the host (host tier only)
    dropped: list  # host victims


def check_admission(admission: str, where: str = "--admission") -> None:
    if admission not in ADMISSIONS:
        raise MoecacheError(f"{where} {admission}: known are {', '.join(ADMISSIONS)}")


def reads_ahead(policy: EvictionPolicy, given) -> bool:
    """Whether a tier's rule reads the future `given` it (None: none given, which refuses a
    rule that needs it)."""
    if not policy.needs_future:
        return False
    if given is None:
        raise MoecacheError(f"rule {policy.name} reads the future: its tier needs the demand")
    return True


class DeviceTier:
    """The C experts of one stream's device; `reset` starts a stream, `decide` plans token
    t and updates the pool."""

    def __init__(self, policy: EvictionPolicy, admission: str, where: str = "--admission"):
        check_admission(admission, where)
        self.policy, self.bypass = policy, admission == "bypass"

    def reset(self, requests: np.ndarray | None = None) -> None:
        """A new stream, the pool empty. `requests` [T, k]: the stream's demand, for a rule
        that reads the future, whose bypass then predicts by the true next use (any other
        rule, or none given: recency)."""
        policy = self.policy
        ahead = reads_ahead(policy, requests)
        policy.reset(requests[None] if ahead else None, streams=1)
        self.pools = Pools(1, policy.num_experts, policy.capacity)
        if ahead:
            foresight = getattr(policy, "foresight", None)
            self.predict = TrueNextUse(requests, policy.num_experts, foresight)
        else:
            self.predict = Recency(policy.num_experts)
        self.been_full = False

    def fill(self) -> None:
        """Every slot taken (the all-resident reference: C = N, nothing ever moves)."""
        n = self.policy.num_experts
        self.pools = Pools.holding(range(n), n, self.policy.capacity)

    def decide(self, t: int, request, probs=None) -> tuple[StepChange, np.ndarray, bool]:
        """Token t's request [k] (`probs` [N]: its router probabilities, for a rule that
        reads them): the plan, the requested experts that were missing in request order
        (copied or computed: the host must hold them) and whether the pool had been full
        before token t (records/counting.py)."""
        at = np.asarray(request, dtype=np.int64)[None]
        row = None if probs is None or not self.policy.needs_probs else probs[None]
        plan, missing = device_step(self.policy, t, at, row, self.pools, self.bypass, self.predict)
        full_before = self.been_full
        self.pools.apply(1, plan)
        count = self.pools.count[0]
        self.been_full = bool(counting.has_been_full(full_before, count, self.policy.capacity))
        return plan, missing, full_before


class HostTier:
    """The H experts of host memory over the disk: one request per token with device
    misses, in the host's own clock; everything it lacks is read. `reset` starts a stream."""

    def __init__(self, policy: EvictionPolicy):
        self.policy = policy

    def reset(self, groups: np.ndarray | None = None) -> None:
        """A new stream, the host empty. `groups` [R, k]: every request it will serve, PAD
        after each, read by a rule that reads the future."""
        policy = self.policy
        ahead = reads_ahead(policy, groups)
        policy.reset(future(groups) if ahead else None, streams=1)
        self.pools = Pools(1, policy.num_experts, policy.capacity)
        self.clock = 0

    def decide(self, misses) -> tuple[list, list]:
        """(read from disk, dropped) for one token's device misses."""
        if not len(misses):
            return [], []
        at = np.asarray(misses, dtype=np.int64)[None]
        plan = self.policy.step(self.clock, at, None, self.pools)
        self.pools.apply(1, plan)
        self.clock += 1
        return at[plan.miss].tolist(), np.asarray(plan.victims).tolist()


class LayerTiers:
    """Both tiers of one layer, token by token (host None: every expert in host memory,
    no disk): the harness's form, which never reads the future."""

    def __init__(self, device: DeviceTier, host: HostTier | None):
        self.device, self.host = device, host

    def reset(self) -> None:
        self.device.reset()
        if self.host is not None:
            self.host.reset()

    def decide(self, t: int, request: list[int]) -> tuple[Moves, bool]:
        """Token t's moves, and whether the device pool had been full before it."""
        plan, missing, full_before = self.device.decide(t, request)
        taken = set(plan.at[plan.miss].tolist())
        copied = [e for e in request if e in taken]  # in request order, as decoded
        computed = [e for e in missing.tolist() if e not in taken]
        read, dropped = [], []
        if self.host is not None:
            read, dropped = self.host.decide(missing)  # every device miss, copied or not
        evicted = np.asarray(plan.victims).tolist()
        return Moves(copied, computed, evicted, read, dropped), full_before
