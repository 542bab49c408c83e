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
  recency (policies/admission.py).

Every device miss, copied or computed, needs the expert in host memory: the host tier sees
the device's misses, one group per token that has any, and reads from disk what it lacks
(its own rule's victims make room; the host starts empty). Each token of each tier is
policies/tiers.py's, the schedule the tiered harness decides with too; here, over recorded
demand, a stream's device runs first and hands its misses to the host, so that either
tier's rule may read the future. Counts per stream: `copies` (host to device), `steady` (of
which after the device pool was first full, as records/counting.py splits them), `reads`
(disk to host), `computes` (on the host).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moecache.errors import MoecacheError
from moecache.policies import EventPolicy, EvictionPolicy
from moecache.policies.tiers import DeviceTier, HostTier, check_admission
from moecache.records import counting
from moecache.records.demand import PAD, Demand
from moecache.records.shape import check_shape
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


def check_layout(demand: Demand, capacity: int, host: int | None, admission: str) -> None:
    """Refuse, in one line, a layout the tiers cannot hold."""
    demand.check_capacity(capacity)
    check_admission(admission)
    if host is not None:
        where, note = f"--host {host}", "--host inf: no disk"
        check_shape(None, capacity, demand.num_experts, host, where=where, note=note)


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
    check_layout(demand, capacity, host, admission)
    device = DeviceTier(ranked_rule(rule, demand, capacity, "device"), admission)
    keeper = None if host is None else HostTier(ranked_rule(host_rule, demand, host, "host"))
    out = TierCounts(*(np.zeros(len(demand.streams), dtype=np.int64) for _ in COUNTS))
    if keep:
        out.device, out.host = [], []
    for s in range(len(demand.streams)):
        requests = demand.requests[s, : demand.lengths[s]]
        probs = None if demand.probs is None else demand.probs[s, : demand.lengths[s]]
        copies, full, misses, held = device_stream(device, requests, probs)
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


def device_stream(device: DeviceTier, requests, probs):
    """One stream on the device: copies per token, whether the pool had been full before
    it, each token's misses (copied or computed: what the host must hold) and what the
    device holds after each token [T, N]."""
    device.reset(requests)
    copies = np.zeros(len(requests), dtype=np.int64)
    full = np.zeros(len(requests), dtype=bool)
    held = np.zeros((len(requests), device.policy.num_experts), dtype=bool)
    misses = []
    for t, request in enumerate(requests):
        plan, missing, full[t] = device.decide(t, request, None if probs is None else probs[t])
        copies[t] = plan.copies[0]
        misses.append(missing)
        held[t] = device.pools.resident[0]
    return copies, full, misses, held


def host_stream(host: HostTier, misses: list[np.ndarray], top_k: int):
    """Disk reads of one stream's host tier and what it holds after each token [T, N]: it
    serves the device's misses, one request per token that has any, and starts empty. The
    device runs first, so that a host rule that reads the future is given its requests."""
    held = np.zeros((len(misses), host.policy.num_experts), dtype=bool)
    groups = [m for m in misses if len(m)]
    if not groups:
        return 0, held
    rows = np.full((len(groups), top_k), PAD, dtype=np.int64)
    for i, group in enumerate(groups):
        rows[i, : len(group)] = group
    host.reset(rows)
    reads = 0
    for t, missed in enumerate(misses):
        reads += len(host.decide(missed)[0])
        held[t] = host.pools.resident[0]  # a token without misses leaves the host as it was
    return reads, held
