"""A missed expert computed where its weights are, in host memory (a bypassed miss), and
the clock the tiered block times its events with.

The kernel is the model's own per-expert one (model/kernel.py's `expert`) over a set of
host slots, as the pooled block's is over the device slots (pool.slot_experts). On a CPU
machine "device" slots and host slots are both host memory and the same cores compute
both: a host compute then costs what a device one does, and only a GPU prices them apart.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from moecache import gpu
from moecache.harness.pool import slot_experts
from moecache.model.kernel import expert


def kernel_over(experts, slots: dict[str, torch.Tensor]):
    """The model's experts module `experts` computing from `slots` (name -> [S, ...])."""
    capacity = len(next(iter(slots.values())))
    return slot_experts(SimpleNamespace(experts=experts, slots=slots), capacity)


def host_matvec(kernel, slot: int, x: torch.Tensor) -> torch.Tensor:
    """One token's output of the expert in host slot `slot` (x on the host, out moved back
    to x's device)."""
    return expert(kernel, slot, x.to("cpu", non_blocking=False)).to(x.device)


class Clock:
    """Seconds on the monotonic clock, waiting for a CUDA device's queued work first."""

    def __init__(self, device: torch.device):
        self.device = device

    def now(self) -> float:
        gpu.synchronize(self.device)
        return time.perf_counter()
