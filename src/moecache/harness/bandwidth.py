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
import time

import numpy as np
import torch

from moecache import gpu
from moecache.harness.link import SlowLink, spin_until
from moecache.harness.pool import ExpertPool, HostExperts
from moecache.harness.timing import Stopwatch
from moecache.policies import PoolChange

GROUP_SIZES = (1, 2, 4, 8)
# Before each timed group, the clock is left to run this long untouched: in a run a
# token's copies follow its compute, never the previous group's copies (a CPU copies an
# expert faster right after another copy), so every multiplier's groups start alike.
GAP_SECONDS = 3e-3
MAX_SAMPLES = 20  # per round, for the fastest multiplier


def measure(
    layers,
    device: str,
    multipliers,
    ring_mib: int,
    rounds: int = 15,
    capacity: int = 8,
    link: str = "auto",
) -> dict:
    """`layers`: the experts modules of the restricted layers (any family's fused experts);
    `capacity`: a run's slots per layer (its slots in all size the link's device ring, so
    a repeat's destination is as warm as a real copy's); `link`: the slower link's kind."""
    capacity = max(capacity, max(GROUP_SIZES))
    hosts = [HostExperts(experts, capacity, device) for experts in layers]
    host = hosts[0]
    link = SlowLink(
        host.first_expert(),
        device,
        ring_mib,
        host.pinned,
        capacity * len(hosts),
        link,
    )
    report = measure_pools(hosts, link, multipliers, capacity, rounds)
    large = large_copy_seconds(host, device)
    report["large_copy_ms"] = 1e3 * large
    report["large_gib_per_s"] = host.expert_bytes * host.num_experts / 2**30 / large
    return report


def measure_pools(hosts, link, multipliers, capacity: int, rounds: int = 15) -> dict:
    """The same through given host experts and link: a decode job's own, between its
    passes, so that the copies meet the caches as the run's do. Slots are reused in the
    order a least-recently-used pool would."""
    pools = {m: [ExpertPool(h, capacity, m, link) for h in hosts] for m in multipliers}
    times = {m: {g: [] for g in GROUP_SIZES} for m in multipliers}
    nxt, cursor = 0, {}
    for r in range(rounds + 1):  # round 0 warms up and is dropped
        for i in range(len(multipliers)):  # a rotating order
            m = multipliers[(i + r) % len(multipliers)]
            # Fast copies are timed more often, so that every multiplier's line is as sure
            # (a charged link's groups all take the real copies' time: as many of each).
            even = link.kind == "charge"
            for _ in range(MAX_SAMPLES if even else min(MAX_SAMPLES, -(-max(multipliers) // m))):
                for g in GROUP_SIZES:
                    pool = pools[m][nxt % len(hosts)]
                    nxt += 1
                    admit, cursor[id(pool)] = absent(pool, g, cursor.get(id(pool), 0))
                    over = len(pool.slot_of) + g - pool.capacity
                    if over > 0:
                        pool.apply(PoolChange(evict=list(pool.slot_of)[:over]))
                    pool.clear_counts()
                    spin_until(time.perf_counter() + GAP_SECONDS)
                    pool.apply(PoolChange(admit=admit))
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
    host = hosts[0]
    return {
        "experts": host.num_experts,
        "layers": len(hosts),
        "expert_bytes": host.expert_bytes,
        "tau_ms": one,
        "group_overhead_ms": statistics.median(r["group_overhead_ms"] for r in rows.values()),
        "multipliers": rows,
        "loop_gib_per_s": host.expert_bytes / 2**30 / (one / 1e3),
        "link": link.kind,
        "link_ring_bytes": link.nbytes,
        "rounds": rounds,
    }


def large_copy_seconds(host: HostExperts, device: str, repeats: int = 5) -> float:
    """One copy of all the layer's expert bytes at once, for comparison with the loop."""
    nbytes = host.expert_bytes * host.num_experts
    empty = gpu.empty_pinned if host.pinned else torch.empty
    flat_host = empty(nbytes, dtype=torch.uint8).fill_(1)
    flat_device = torch.empty(nbytes, dtype=torch.uint8, device=device)
    watch, times = Stopwatch(device), []
    for _ in range(repeats):
        watch.start()
        flat_device.copy_(flat_host, non_blocking=host.pinned)
        times.append(watch.stop())
    return statistics.median(times)


def absent(pool: ExpertPool, g: int, start: int) -> tuple[list[int], int]:
    """The next `g` experts from `start`, cycling through the layer, that the pool does not
    hold; and where to start next time."""
    chosen, e = [], start
    while len(chosen) < g:
        if e % pool.num_experts not in pool.slot_of:
            chosen.append(e % pool.num_experts)
        e += 1
    return chosen, e
