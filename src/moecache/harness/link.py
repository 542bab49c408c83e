"""The copy multiplier as a slower link: m copies of an expert cost m times one copy.

A multiplier m makes every expert copy move m times its bytes over the same path, host to
device. The first copy is the real one, into the expert's slot; each of the other m - 1
copies an expert-shaped block of a host ring into a block of a device ring, with the same
calls, shapes and bytes as the real copy. Every repeat takes the next blocks. The host ring
is larger than a last-level cache, so each repeat reads memory no cache holds, as a real
copy reads an offloaded expert; the device ring has as many blocks as the run's slots, so
each repeat writes memory as warm as a real copy's slot. (Repeating the copy of the same
expert into the same slot would instead be served from a CPU's caches and price nothing
like a slower link: measured, tau(10) was 3 x tau(1).) The rings are written once at
start, so their pages are real memory and not the shared zero page.
"""

from __future__ import annotations

import torch


class SlowLink:
    def __init__(self, gate_up, down, device, ring_mib: int, pin: bool, device_blocks: int):
        """`gate_up`, `down`: one expert's two weight tensors (shapes and dtype); a host
        ring of `ring_mib` MiB, a device ring of `device_blocks` experts."""
        expert_bytes = (gate_up.numel() + down.numel()) * gate_up.element_size()

        def blocks(mib):
            return max(2, -(-mib * 2**20 // expert_bytes))

        def ring(like, where, count, pinned=False):
            block = torch.empty((count, *like.shape), dtype=like.dtype, pin_memory=pinned)
            return block.fill_(1).to(where)

        self.host_blocks = blocks(ring_mib)
        self.device_blocks = max(2, device_blocks)
        self.nbytes = (self.host_blocks + self.device_blocks) * expert_bytes
        host, on_device = self.host_blocks, self.device_blocks
        self.host = ring(gate_up, "cpu", host, pin), ring(down, "cpu", host, pin)
        self.device = ring(gate_up, device, on_device), ring(down, device, on_device)
        self.non_blocking, self.at = pin, 0

    def repeat(self, times: int) -> None:
        """Queue `times` more copies of one expert's bytes, each from cold addresses."""
        (host_gate_up, host_down), (gate_up, down) = self.host, self.device
        for _ in range(times):
            self.at += 1
            src, dst = self.at % self.host_blocks, self.at % self.device_blocks
            gate_up[dst].copy_(host_gate_up[src], non_blocking=self.non_blocking)
            down[dst].copy_(host_down[src], non_blocking=self.non_blocking)
