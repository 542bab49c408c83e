"""Copy bandwidth: the time of one expert copy at each copy multiplier, apart from the
fixed overhead of a group of copies, through the harness's own copy path.

Groups of 1, 2, 4 and 8 copies are timed at every multiplier, interleaved over rounds, each
group taking the next experts of the next restricted layer, so the sources rotate over all
the offloaded weights as in a run. Per
multiplier a least-squares line through the median time of each group size gives the time
per copy (its slope, tau) and the fixed cost of a group (its intercept). A slower link
priced honestly has tau(m) = m tau(1).
"""

from __future__ import annotations

import statistics

import numpy as np
import torch

from moecache.harness.link import SlowLink
from moecache.harness.pool import ExpertPool, HostExperts
from moecache.harness.timing import Stopwatch
from moecache.policies import Plan

GROUP_SIZES = (1, 2, 4, 8)


def measure(layers, device: str, multipliers, ring_mib: int, rounds: int = 15) -> dict:
    """`layers`: the experts modules of the restricted layers (OlmoeExperts or alike)."""
    hosts = [HostExperts(experts, max(GROUP_SIZES), device) for experts in layers]
    host = hosts[0]
    link = SlowLink(host.gate_up_host[0], host.down_host[0], device, ring_mib, host.pinned)
    pools = {m: [ExpertPool(h, max(GROUP_SIZES), m, link) for h in hosts] for m in multipliers}
    times = {m: {g: [] for g in GROUP_SIZES} for m in multipliers}
    nxt = 0
    for r in range(rounds + 1):  # round 0 warms up and is dropped
        for i in range(len(multipliers)):  # a rotating order
            m = multipliers[(i + r) % len(multipliers)]
            for g in GROUP_SIZES:
                pool = pools[m][nxt % len(hosts)]
                pool.reset()
                pool.clear_counts()
                admit = [(nxt + j) % host.num_experts for j in range(g)]
                nxt += g
                pool.apply(Plan(admit=admit))
                if r:
                    times[m][g].append(pool.laps[-1].seconds())
    rows = {}
    for m in multipliers:
        medians = [statistics.median(times[m][g]) for g in GROUP_SIZES]
        slope, intercept = np.polyfit(GROUP_SIZES, medians, 1)
        rows[str(m)] = {"tau_ms": 1e3 * slope, "group_overhead_ms": 1e3 * intercept}
    one = rows[str(min(multipliers))]["tau_ms"]
    for m in multipliers:
        rows[str(m)]["ratio_to_1x"] = rows[str(m)]["tau_ms"] / one
    large = large_copy_seconds(host, device)
    gib = host.expert_bytes * host.num_experts / 2**30
    tau_1x = rows[str(min(multipliers))]["tau_ms"]
    return {
        "experts": host.num_experts,
        "layers": len(hosts),
        "expert_bytes": host.expert_bytes,
        "tau_ms": tau_1x,
        "group_overhead_ms": statistics.median(r["group_overhead_ms"] for r in rows.values()),
        "multipliers": rows,
        "loop_gib_per_s": host.expert_bytes / 2**30 / (tau_1x / 1e3),
        "large_copy_ms": 1e3 * large,
        "large_gib_per_s": gib / large,
        "link_ring_bytes": link.nbytes,
        "rounds": rounds,
    }


def large_copy_seconds(host: HostExperts, device: str, repeats: int = 5) -> float:
    """One copy of all the layer's expert bytes at once, for comparison with the loop."""
    nbytes = host.expert_bytes * host.num_experts
    flat_host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=host.pinned).fill_(1)
    flat_device = torch.empty(nbytes, dtype=torch.uint8, device=device)
    watch, times = Stopwatch(device), []
    for _ in range(repeats):
        watch.start()
        flat_device.copy_(flat_host, non_blocking=host.pinned)
        times.append(watch.stop())
    return statistics.median(times)
