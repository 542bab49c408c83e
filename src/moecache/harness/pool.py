"""One restricted layer's experts offloaded: all N in host memory, C slots on the device.

`HostExperts` holds a layer's expert weights in host memory (pinned on a GPU) and the
device slot storage; the decode runs of one process share it, each through an
`ExpertPool` of its own capacity, copy multiplier and counters (runs decoded token by
token beside each other take slot storage of their own, `own_slots`). A miss copies the expert's
weights into a free slot; evicting only forgets the slot, no data moves. Copies are queued
on the current stream, the one the expert matmuls use, so the matmuls see the new weights
and wait for them, as the paper's blocking copies; each group of copies is timed (CUDA
events on a GPU, read once the token's step has finished; the monotonic clock on a CPU).
"""

from __future__ import annotations

import copy
import time

import torch
from torch import nn

from moecache.harness.link import SlowLink
from moecache.harness.timing import Lap, Stopwatch
from moecache.policies import Plan


class HostExperts:
    def __init__(self, experts, capacity: int, device: str | torch.device):
        """`experts`: transformers' fused OlmoeExperts (gate_up_proj [N, 2I, H], down_proj
        [N, H, I]); its weights are read here, the caller moves them off the device."""
        self.device = torch.device(device)
        self.pinned = self.device.type == "cuda"
        self.experts = experts
        self.gate_up_host = experts.gate_up_proj.detach().to("cpu").contiguous()
        self.down_host = experts.down_proj.detach().to("cpu").contiguous()
        if self.pinned:
            self.gate_up_host = self.gate_up_host.pin_memory()
            self.down_host = self.down_host.pin_memory()
        shape = (capacity, *self.gate_up_host.shape[1:]), (capacity, *self.down_host.shape[1:])
        dtype = self.gate_up_host.dtype
        self.gate_up = torch.empty(shape[0], dtype=dtype, device=self.device)
        self.down = torch.empty(shape[1], dtype=dtype, device=self.device)
        self.num_experts = self.gate_up_host.shape[0]
        self.expert_bytes = (
            self.gate_up_host[0].numel() + self.down_host[0].numel()
        ) * self.gate_up_host.element_size()

    @property
    def slot_bytes(self) -> int:
        return len(self.gate_up) * self.expert_bytes

    def own_slots(self) -> HostExperts:
        """The same host weights with slot storage of their own: for runs decoded token by
        token beside each other, whose residents must not overwrite each other's."""
        other = copy.copy(self)
        other.gate_up, other.down = torch.empty_like(self.gate_up), torch.empty_like(self.down)
        return other


class ExpertPool:
    def __init__(self, host: HostExperts, capacity: int, multiplier: int, link: SlowLink):
        if capacity > len(host.gate_up):
            raise ValueError(f"capacity {capacity} over the {len(host.gate_up)} slots held")
        self.host, self.capacity, self.multiplier, self.link = host, capacity, multiplier, link
        self.num_experts, self.expert_bytes = host.num_experts, host.expert_bytes
        self.kernel = slot_experts(host, capacity)
        self.watch = Stopwatch(host.device)
        self.clear_counts()
        self.reset()

    def reset(self) -> None:
        """An empty pool for a new sequence (counters are kept)."""
        self.slot_of: dict[int, int] = {}
        self.free = list(range(self.capacity - 1, -1, -1))
        self.been_full = False

    def clear_counts(self) -> None:
        self.fills = self.steady = self.groups = 0
        self.charged = 0.0  # seconds a charged link added to the laps (and to steps)
        self.laps = []

    @property
    def copy_seconds(self) -> float:
        return sum(lap.seconds() for lap in self.laps)

    @property
    def resident(self):
        """The resident experts: a live set-like view (no set is built per token)."""
        return self.slot_of.keys()

    def apply(self, plan: Plan) -> None:
        for e in plan.evict:
            self.free.append(self.slot_of.pop(e))
        if not plan.admit:
            return
        host = self.host
        self.watch.start()
        started = time.perf_counter()
        for e in plan.admit:
            slot = self.free.pop()
            host.gate_up[slot].copy_(host.gate_up_host[e], non_blocking=host.pinned)
            host.down[slot].copy_(host.down_host[e], non_blocking=host.pinned)
            self.link.repeat(self.multiplier - 1)
            self.slot_of[e] = slot
        self.link.hold(self.multiplier - 1, started)
        lap = self.watch.lap()
        charged = self.link.charge(self.multiplier - 1, lap)
        if charged:
            lap = Lap(seconds_=lap.seconds() + charged)
            self.charged += charged
        self.laps.append(lap)
        self.groups += 1
        # The whole group that reaches capacity for the first time still counts as filling.
        if self.been_full:
            self.steady += len(plan.admit)
        else:
            self.fills += len(plan.admit)
            self.been_full = len(self.slot_of) == self.capacity


def slot_experts(host: HostExperts, capacity: int) -> nn.Module:
    """The model's own experts module over the first `capacity` device slots: the same
    class, hence the same configured kernel, with slot ids in place of expert ids."""
    config = copy.copy(host.experts.config)
    config.num_experts = capacity
    with torch.device("meta"):
        kernel = type(host.experts)(config)
    kernel.gate_up_proj = nn.Parameter(host.gate_up[:capacity], requires_grad=False)
    kernel.down_proj = nn.Parameter(host.down[:capacity], requires_grad=False)
    return kernel
