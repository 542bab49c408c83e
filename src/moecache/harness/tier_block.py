"""The tiered MoE block: a restricted layer decoded over a device pool of C experts, a host
cache of H experts and the disk (issue 40, point 3; docs/tiers.md).

Per token it asks its LayerTiers (policies/tiers.py) what moves, then moves it for real: the
host drops its victims and reads what it lacks from the safetensors file on disk
(disk_pool.py), the device copies its admitted experts from the host cache into free slots,
and the token is computed with the model's own per-expert kernel, each expert where it is:
from a device slot, or for a bypassed miss from its host slot (host_compute.py), in the
router's order, as the model's own kernel adds them. Reads, copies and host computes are
counted and timed per sequence (one stream: this layer over that sequence).
"""

from __future__ import annotations

import torch
from torch import nn

from moecache.harness.disk_pool import HostCache
from moecache.harness.host_compute import Clock, host_matvec, kernel_over
from moecache.model.kernel import expert
from moecache.policies.tiers import LayerTiers

EVENTS = ("copies", "steady", "reads", "computes")
TIMES = ("copy_seconds", "read_seconds", "compute_seconds", "device_seconds", "decide_seconds")


class TieredMoeBlock(nn.Module):
    def __init__(self, mlp, adapter, host, slots, tiers: LayerTiers, cache: HostCache | None):
        """`host`: the layer's HostExperts (all N experts in host memory); `slots`: the
        device slots [C, ...] by parameter name; `cache`: the host cache over the disk
        (None: no disk, the host holds every expert)."""
        super().__init__()
        object.__setattr__(self, "own", mlp)  # its experts are offloaded: not registered
        self.adapter, self.gate = adapter, adapter.router(mlp)
        self.tiers, self.cache, self.slots = tiers, cache, slots
        experts = adapter.experts(mlp)
        self.device_kernel = kernel_over(experts, slots)
        held = host.host if cache is None else cache.slots
        self.host_kernel = kernel_over(experts, held)
        self.host_weights = host.host
        self.clock = Clock(next(iter(slots.values())).device)
        self.resident = False
        self.reset()

    def hold_all(self) -> None:
        """The all-resident reference: every expert in its own device slot, nothing moves."""
        self.resident = True
        for name, slots in self.slots.items():
            slots.copy_(self.host_weights[name])

    def reset(self) -> None:
        """A new sequence: empty tiers (full ones for the reference) and fresh counters."""
        self.tiers.reset()
        capacity = len(next(iter(self.slots.values())))
        if self.resident:
            self.tiers.device.fill()
        self.slot_of = {e: e for e in range(capacity)} if self.resident else {}
        self.free = [] if self.resident else list(range(capacity - 1, -1, -1))
        if self.cache is not None:
            self.cache.reset()
        self.t, self.requests = 0, []
        self.counts = dict.fromkeys(EVENTS, 0) | dict.fromkeys(TIMES, 0.0)
        self.counts["device_computes"] = 0  # requested experts computed from a device slot

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = hidden_states.shape
        x = hidden_states.reshape(-1, hidden)
        _, top_weights, top_index = self.adapter.route(self.own, x)
        requests = top_index.tolist()
        out = torch.cat(
            [self.token(x[i : i + 1], requests[i], top_weights[i]) for i in range(len(x))]
        )
        shared = self.adapter.shared(self.own, x)
        if shared is not None:
            out = out + shared
        return self.adapter.output(out.reshape(batch, length, hidden), top_weights)

    def token(self, x: torch.Tensor, request: list[int], weights: torch.Tensor) -> torch.Tensor:
        counts, clock = self.counts, self.clock
        started = clock.now()
        moves, full_before = self.tiers.decide(self.t, request)
        counts["decide_seconds"] += clock.now() - started
        self.requests.append(request)
        self.t += 1
        for e in moves.evicted:
            self.free.append(self.slot_of.pop(e))
        self.read(moves.dropped, moves.read)
        if moves.copied:
            started = clock.now()
            for e in moves.copied:
                self.copy_in(e)
            counts["copy_seconds"] += clock.now() - started
            counts["copies"] += len(moves.copied)
            counts["steady"] += len(moves.copied) if full_before else 0
        counts["computes"] += len(moves.computed)
        out = torch.zeros_like(x)
        computed = set(moves.computed)
        for j, e in enumerate(request):
            if e in computed:
                started = clock.now()
                out += weights[j] * host_matvec(self.host_kernel, self.host_slot(e), x)
                counts["compute_seconds"] += clock.now() - started
            else:
                started = clock.now()
                out += weights[j] * expert(self.device_kernel, self.slot_of[e], x)
                counts["device_seconds"] += clock.now() - started
                counts["device_computes"] += 1
        return out

    def read(self, dropped: list[int], read: list[int]) -> None:
        if self.cache is None:
            return
        for e in dropped:
            self.cache.drop(e)
        for e in read:
            self.counts["read_seconds"] += self.cache.read(e)
        self.counts["reads"] += len(read)

    def host_slot(self, e: int) -> int:
        return e if self.cache is None else self.cache.slot_of[e]

    def copy_in(self, e: int) -> None:
        """Expert e from host memory into a free device slot."""
        slot = self.free.pop()
        source = self.host_weights if self.cache is None else self.cache.slots
        at = self.host_slot(e)
        for name, slots in self.slots.items():
            slots[slot].copy_(source[name][at], non_blocking=False)
        self.slot_of[e] = slot
