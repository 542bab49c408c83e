"""One restricted layer's expert pool: all N experts in host memory, C slots on the device.

A miss copies the expert's weights into a free slot; evicting only forgets the slot, no
data moves. Copies are queued on the current stream, the stream the expert matmuls use, so
the matmuls always see the new weights; each group of copies is timed (CUDA events on a
GPU, the monotonic clock on a CPU) and the timer waits for it, so copies block like the
paper's. A copy multiplier m repeats every copy m times to emulate a slower link.
"""

from __future__ import annotations

import torch

from moecache.harness.timing import Stopwatch
from moecache.policies import Plan


class ExpertPool:
    def __init__(self, experts, capacity: int, device: str, multiplier: int = 1):
        """`experts`: transformers' fused OlmoeExperts (gate_up_proj [N, 2I, H],
        down_proj [N, H, I]), whose weights move to host memory here."""
        device = torch.device(device)
        pin = device.type == "cuda"
        self.host_gate_up = experts.gate_up_proj.detach().to("cpu").contiguous()
        self.host_down = experts.down_proj.detach().to("cpu").contiguous()
        if pin:
            self.host_gate_up = self.host_gate_up.pin_memory()
            self.host_down = self.host_down.pin_memory()
        self.gate_up = torch.empty(
            (capacity, *self.host_gate_up.shape[1:]), dtype=self.host_gate_up.dtype, device=device
        )
        self.down = torch.empty(
            (capacity, *self.host_down.shape[1:]), dtype=self.host_down.dtype, device=device
        )
        self.capacity, self.multiplier, self.non_blocking = capacity, multiplier, pin
        self.num_experts = self.host_gate_up.shape[0]
        self.expert_bytes = (
            self.host_gate_up[0].numel() + self.host_down[0].numel()
        ) * self.host_down.element_size()
        self.watch = Stopwatch(device)
        self.reset()

    def reset(self) -> None:
        """An empty pool for a new sequence (counters are kept)."""
        self.slot_of: dict[int, int] = {}
        self.free = list(range(self.capacity - 1, -1, -1))
        self.been_full = False

    def clear_counts(self) -> None:
        self.fills = self.steady = 0
        self.copy_seconds = 0.0

    @property
    def resident(self) -> frozenset[int]:
        return frozenset(self.slot_of)

    def apply(self, plan: Plan) -> None:
        for e in plan.evict:
            self.free.append(self.slot_of.pop(e))
        if not plan.admit:
            return
        self.watch.start()
        for e in plan.admit:
            slot = self.free.pop()
            for _ in range(self.multiplier):
                self.gate_up[slot].copy_(self.host_gate_up[e], non_blocking=self.non_blocking)
                self.down[slot].copy_(self.host_down[e], non_blocking=self.non_blocking)
            self.slot_of[e] = slot
        self.copy_seconds += self.watch.stop()
        # The whole group that reaches capacity for the first time still counts as filling.
        if self.been_full:
            self.steady += len(plan.admit)
        else:
            self.fills += len(plan.admit)
            self.been_full = len(self.slot_of) == self.capacity
