"""The copy multiplier as a slower link: m copies of an expert cost m times one copy.

A multiplier m makes every expert copy move m times its bytes over the same path, host to
device. The first copy is the real one, into the expert's slot; each of the other m - 1
copies an expert-shaped block of a host ring into a device ring, with the same calls,
shapes and bytes as the real copy, from and to addresses the caches do not hold: the
rings are larger than a last-level cache and every repeat takes their next block.
(Repeating the copy of the same expert into the same slot would instead be served from a
CPU's caches and price nothing like a slower link.) The rings are written once at start,
so their pages are real memory and not the shared zero page.
"""

from __future__ import annotations

import torch


class SlowLink:
    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor, device, ring_mib: int, pin: bool):
        """`gate_up`, `down`: one expert's two weight tensors (shapes and dtype)."""
        expert_bytes = (gate_up.numel() + down.numel()) * gate_up.element_size()
        self.blocks = max(2, -(-ring_mib * 2**20 // expert_bytes))
        self.nbytes = self.blocks * expert_bytes

        def ring(like, where, pinned=False):
            block = torch.empty((self.blocks, *like.shape), dtype=like.dtype, pin_memory=pinned)
            return block.fill_(1).to(where)

        self.host = ring(gate_up, "cpu", pin), ring(down, "cpu", pin)
        self.device = ring(gate_up, device), ring(down, device)
        self.non_blocking, self.at = pin, 0

    def repeat(self, times: int) -> None:
        """Queue `times` more copies of one expert's bytes, each from cold addresses."""
        (host_gate_up, host_down), (gate_up, down) = self.host, self.device
        for _ in range(times):
            self.at = (self.at + 1) % self.blocks
            gate_up[self.at].copy_(host_gate_up[self.at], non_blocking=self.non_blocking)
            down[self.at].copy_(host_down[self.at], non_blocking=self.non_blocking)
