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

from moecache import gpu
from moecache.harness.link import SlowLink
from moecache.harness.timing import Lap, Stopwatch
from moecache.model.memory import DEVICE, HOST, LEDGER
from moecache.policies import PoolChange
from moecache.records import counting


class HostExperts:
    def __init__(self, experts, capacity: int, device: str | torch.device):
        """`experts`: transformers' fused experts module of any family, every parameter
        [N, ...] over the expert axis (gate_up_proj and down_proj; GPT-OSS adds their
        biases); its weights are read here, the caller moves them off the device."""
        self.device = torch.device(device)
        self.pinned = gpu.cuda_path(self.device)
        self.experts = experts
        self.host: dict[str, torch.Tensor] = {}  # parameter name -> [N, ...] in host memory
        for name, weight in experts.named_parameters(recurse=False):
            # The offloaded experts' one host copy (harness/placement.py) is read in place;
            # a module still on the device is copied out once, counted by the accountant.
            host = weight.detach().to("cpu").contiguous()
            if self.pinned and not gpu.is_pinned(host):
                host = LEDGER.adopt("experts", HOST, gpu.pin(host))
            self.host[name] = host
        self.num_experts = len(next(iter(self.host.values())))
        self.expert_bytes = sum(h[0].numel() * h.element_size() for h in self.host.values())
        self.slots = self.new_slots(capacity)  # parameter name -> [capacity, ...] on device

    def new_slots(self, capacity: int) -> dict[str, torch.Tensor]:
        """`capacity` slots of device storage, through the accountant."""
        return {
            name: LEDGER.empty("slots", DEVICE, (capacity, *h.shape[1:]), h.dtype, self.device)
            for name, h in self.host.items()
        }

    @property
    def slot_bytes(self) -> int:
        return self.capacity * self.expert_bytes

    @property
    def capacity(self) -> int:
        return len(next(iter(self.slots.values())))

    def load(self, e: int, slot: int) -> None:
        """Copy expert e's weights into device slot `slot`, a tensor at a time."""
        for name, slots in self.slots.items():
            slots[slot].copy_(self.host[name][e], non_blocking=self.pinned)

    def first_expert(self) -> list[torch.Tensor]:
        """One expert's host tensors (what the slower link's device ring copies)."""
        return [h[0] for h in self.host.values()]

    def own_slots(self, capacity: int) -> HostExperts:
        """The same host weights with `capacity` slots of their own: for runs decoded token
        by token beside each other, whose residents must not overwrite each other's."""
        other = copy.copy(self)
        other.slots = self.new_slots(capacity)
        return other


class ExpertPool:
    def __init__(self, host: HostExperts, capacity: int, multiplier: int, link: SlowLink):
        if capacity > host.capacity:
            raise ValueError(f"capacity {capacity} over the {host.capacity} slots held")
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

    def drain(self) -> None:
        """A blocking pool's copies are over when its token is (async_pool.py's are not)."""

    @property
    def copy_seconds(self) -> float:
        return sum(lap.seconds() for lap in self.laps)

    @property
    def resident(self):
        """The resident experts: a live set-like view (no set is built per token)."""
        return self.slot_of.keys()

    def apply(self, change: PoolChange) -> None:
        for e in change.evict:
            self.free.append(self.slot_of.pop(e))
        if not change.admit:
            return
        host = self.host
        self.watch.start()
        started = time.perf_counter()
        for e in change.admit:
            slot = self.free.pop()
            host.load(e, slot)
            self.link.repeat(self.multiplier - 1)
            self.slot_of[e] = slot
        self.link.hold(self.multiplier - 1, started)
        lap = self.watch.lap()
        charged = self.link.charge(self.multiplier - 1, lap)
        if charged:
            lap = Lap(seconds_=lap.seconds() + charged)
            self.charged += charged
        self.laps.append(lap)
        self.count_insertions(len(change.admit))

    def count_insertions(self, copies: int) -> None:
        """A group of `copies` has entered the pool: fills or steady copies, as
        records/counting.py defines them (the group that first fills the pool still fills)."""
        self.groups += 1
        fills, steady = counting.split(copies, self.been_full)
        self.fills, self.steady = self.fills + fills, self.steady + steady
        self.been_full = counting.has_been_full(self.been_full, len(self.slot_of), self.capacity)


def slot_experts(host: HostExperts, capacity: int) -> nn.Module:
    """The model's own experts module over the first `capacity` device slots: the same
    object's class, config and flags, hence the same configured kernel, with slot ids in
    place of expert ids."""
    kernel = unhooked_copy(host.experts)  # shares the original's submodules (its activation)
    kernel._parameters = {
        name: nn.Parameter(slots[:capacity], requires_grad=False)
        for name, slots in host.slots.items()
    }
    kernel.num_experts = capacity
    return kernel


def unhooked_copy(module: nn.Module) -> nn.Module:
    """A shallow copy of `module` that keeps none of its hooks: the model's own experts
    module carries the staging hooks (placement.py) that put the whole layer's N experts in
    place of its parameters while it runs; a kernel over C slots that kept them would compute
    on the staged layer with slot ids (wrong outputs, or a shape error in grouped_mm)."""
    kernel = copy.copy(module)
    for name, value in module.__dict__.items():
        if name.endswith("_hooks") or "_hooks_" in name:  # every hook registry nn.Module keeps
            kernel.__dict__[name] = type(value)()
    kernel.__dict__.pop("_moecache_host", None)
    return kernel
