"""The prices of one tier event, measured apart from any decode (docs/tiers.md, "Measured
in the harness"): a disk read of an expert into the host cache, a copy into a device slot,
one token's matvec from a host slot and from a device slot, in the order a device miss
performs them; tier_runs.py takes a round before each repeat and after the last.
"""

from __future__ import annotations

import random
import statistics

import numpy as np
import torch

from moecache.harness.disk_pool import HostCache
from moecache.harness.host_compute import Clock, host_matvec, kernel_over
from moecache.intervals import bootstrap_ratio
from moecache.model.kernel import expert

PRICES = ("disk_to_host_ms", "host_to_device_ms", "host_compute_ms", "device_compute_ms")


def touch(hosts: dict, disk) -> None:
    """Every expert read once, untimed: the disk's own cache (under the page cache, which
    the reads bypass) is then as warm for the prices as for the decode."""
    for layer in hosts:
        for e in range(hosts[layer].num_experts):
            disk.read(layer, e)


def measure_prices(adapter, own, hosts, disk, capacity: int, seed: int) -> dict:
    """Per event, the ms of each, in the order a device miss performs them: per layer, in a
    shuffled order, every expert read from disk into a host cache of them all, copied from
    there into the next of `capacity` device slots, and one token's matvec computed from
    its host slot (a bypassed miss, just read) and from its slot of the all-resident
    reference (a device hit, as c computes it)."""
    rng = random.Random(seed)
    samples = {key: [] for key in PRICES}
    for layer, mlp in own.items():
        host = hosts[layer]
        cache = HostCache(host, host.num_experts, layer, disk)
        kernel_host = kernel_over(adapter.experts(mlp), cache.slots)
        kernel_device = kernel_over(adapter.experts(mlp), host.slots)
        slots, clock = host.new_slots(capacity), Clock(host.device)
        width = next(iter(host.host.values())).shape[-1]
        x = torch.randn(1, width, dtype=cache.dtype).to(host.device)
        experts = list(range(host.num_experts))
        rng.shuffle(experts)
        for i, e in enumerate(experts):
            samples["disk_to_host_ms"].append(1e3 * cache.read(e))
            started = clock.now()
            for name, target in slots.items():
                target[i % capacity].copy_(cache.tensors(e)[name])
            samples["host_to_device_ms"].append(1e3 * (clock.now() - started))
            started = clock.now()
            host_matvec(kernel_host, cache.slot_of[e], x)
            samples["host_compute_ms"].append(1e3 * (clock.now() - started))
            started = clock.now()
            expert(kernel_device, e, x)
            samples["device_compute_ms"].append(1e3 * (clock.now() - started))
    return samples


def pooled(rounds: list[dict], seed: int) -> dict:
    """The prices measured before each repeat and after the last, pooled (the machine's
    load over the decode falls on them as on the arms)."""
    return {key: summary([v for r in rounds for v in r[key]], seed) for key in rounds[0]}


def summary(values: list[float], seed: int) -> dict:
    ones = np.ones(len(values))
    low, high = bootstrap_ratio(values, ones, seed)
    return {
        "ms": float(np.mean(values)),
        "ci": [float(low), float(high)],
        "median_ms": float(statistics.median(values)),
        "events": len(values),
    }
