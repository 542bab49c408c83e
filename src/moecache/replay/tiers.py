"""Two tiers under the device: replay over a host cache and disk, or over host compute
(docs/tiers.md).

A stream's device pool holds C experts, as in replay/engine.py. Under it, the host holds H
experts over a disk holding all (H = None: the host holds every expert, there is no disk).
Per token, as in the harness, the token's k experts are needed together:

- admission `always`: every requested expert missing on the device is copied in (a host
  to device copy), the device's rule choosing victims among residents the token does not
  need: exactly today's replay;
- admission `bypass`: a missing expert is copied in only into a free slot or when its
  predicted next use is sooner than the victim's; otherwise the token computes it on the
  host (a host compute). The prediction is the true next use for a rule that reads the
  future (farthest-future: the oracle rule; within its foresight when it has one), else
  recency (policies/admission.py, which the tiered harness decides with too).

Every device miss, copied or computed, needs the expert in host memory: the host tier sees
the device's misses, one group per token that has any, and reads from disk what it lacks
(its own rule's victims make room; the host starts empty). Counts per stream: `copies`
(host to device), `steady` (of which after the device pool was first full, as
records/counting.py splits them), `reads` (disk to host), `computes` (on the host).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moecache.errors import MoecacheError
from moecache.policies import EventPolicy, EvictionPolicy
from moecache.policies.admission import ADMISSIONS, Recency, TrueNextUse, device_step
from moecache.policies.pools import Pools
from moecache.records import counting
from moecache.records.batch import future
from moecache.records.demand import PAD, Demand
from moecache.replay import engine

COUNTS = ("copies", "steady", "reads", "computes")


@dataclass
class TierCounts:
    """Per stream, in the demand's stream order."""

    copies: np.ndarray
    steady: np.ndarray
    reads: np.ndarray
    computes: np.ndarray
    # With keep: per stream, [T, N] whether each expert is on the device (and in the host;
    # None without a disk) after each token: the schedule, for the optimum's warm start.
    device: list | None = None
    host: list | None = None


def check_shape(demand: Demand, capacity: int, host: int | None, admission: str) -> None:
    """Refuse, in one line, a layout the tiers cannot hold."""
    demand.check_capacity(capacity)
    if admission not in ADMISSIONS:
        raise MoecacheError(f"--admission {admission}: known are {', '.join(ADMISSIONS)}")
    if host is not None and not capacity <= host <= demand.num_experts:
        raise MoecacheError(
            f"--host {host}: the host holds at least the device's {capacity} experts and at "
            f"most the {demand.num_experts} there are (--host inf: no disk)"
        )


def ranked_rule(text: str, demand: Demand, capacity: int, tier: str) -> EvictionPolicy:
    """A ranked eviction rule for one tier (the event-driven zoo keeps hit and miss state a
    bypassed miss would have to define: not run here)."""
    policy = engine.make_rule(text, demand, capacity)
    if isinstance(policy, EventPolicy):
        raise MoecacheError(
            f"rule {policy.name}: the tiers run the ranked eviction rules (lru, "
            "farthest-future, decayed-frequency, ...), not the event-driven zoo"
        )
    if tier == "host" and policy.needs_probs:
        raise MoecacheError(
            f"host rule {policy.name}: reads router probabilities, which the host's misses lack"
        )
    return policy


def run(
    demand: Demand,
    rule: str,
    capacity: int,
    host: int | None = None,
    host_rule: str = "lru",
    admission: str = "always",
    keep: bool = False,
) -> TierCounts:
    """The tier counts of device rule `rule` over host rule `host_rule` (with `keep`, the
    tiers' contents after each token too)."""
    check_shape(demand, capacity, host, admission)
    device = ranked_rule(rule, demand, capacity, "device")
    keeper = None if host is None else ranked_rule(host_rule, demand, host, "host")
    out = TierCounts(*(np.zeros(len(demand.streams), dtype=np.int64) for _ in COUNTS))
    if keep:
        out.device, out.host = [], []
    for s in range(len(demand.streams)):
        requests = demand.requests[s, : demand.lengths[s]]
        probs = None if demand.probs is None else demand.probs[s, : demand.lengths[s]]
        copies, full, misses, held = device_stream(device, requests, probs, admission == "bypass")
        out.copies[s] = copies.sum()
        out.steady[s] = counting.split(copies, full)[1].sum()
        out.computes[s] = sum(len(m) for m in misses) - out.copies[s]
        hosted = None
        if keeper is not None:
            out.reads[s], hosted = host_stream(keeper, misses, demand.top_k)
        if keep:
            out.device.append(held)
            out.host.append(hosted)
    return out


def device_stream(policy: EvictionPolicy, requests, probs, bypass: bool):
    """One stream on the device: copies per token, whether the pool had been full before
    it, and each token's misses (copied or computed: what the host must hold)."""
    policy.reset(requests[None] if policy.needs_future else None, streams=1)
    pools = Pools(1, policy.num_experts, policy.capacity)
    if policy.needs_future:
        predict = TrueNextUse(requests, policy.num_experts, getattr(policy, "foresight", None))
    else:
        predict = Recency(policy.num_experts)
    copies = np.zeros(len(requests), dtype=np.int64)
    full = np.zeros(len(requests), dtype=bool)
    been_full, misses = False, []
    held = np.zeros((len(requests), policy.num_experts), dtype=bool)
    for t, request in enumerate(requests):
        row = None if probs is None or not policy.needs_probs else probs[t][None]
        step, missing = device_step(policy, t, request[None], row, pools, bypass, predict)
        full[t], copies[t] = been_full, step.copies[0]
        pools.apply(1, step)
        been_full = bool(counting.has_been_full(been_full, pools.count[0], policy.capacity))
        misses.append(missing)
        held[t] = pools.resident[0]
    return copies, full, misses, held


def host_stream(policy: EvictionPolicy, misses: list[np.ndarray], top_k: int):
    """Disk reads of one stream's host tier and what it holds after each token [T, N]: it
    serves the device's misses, one request per token that has any, and starts empty."""
    held = np.zeros((len(misses), policy.num_experts), dtype=bool)
    steps = [t for t, m in enumerate(misses) if len(m)]
    groups = [misses[t] for t in steps]
    if not groups:
        return 0, held
    rows = np.full((len(groups), top_k), PAD, dtype=np.int64)
    for i, group in enumerate(groups):
        rows[i, : len(group)] = group
    policy.reset(future(rows) if policy.needs_future else None, streams=1)
    pools = Pools(1, policy.num_experts, policy.capacity)
    reads = 0
    for i, (t, group) in enumerate(zip(steps, groups, strict=True)):
        step = policy.step(i, group[None], None, pools)
        pools.apply(1, step)
        reads += int(step.copies[0])
        held[t] = pools.resident[0]
    for t in range(1, len(held)):  # a token without misses leaves the host as it was
        if not len(misses[t]):
            held[t] = held[t - 1]
    return reads, held
