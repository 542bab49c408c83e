"""Qwen2-MoE (Qwen/Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen3-MoE's router and sparse layers,
plus one shared expert per block whose output is scaled by a sigmoid gate of its own
(`shared_expert`, `shared_expert_gate`); it is always resident and never offloaded."""

from __future__ import annotations

import torch

from moecache.model.qwen3_moe import Qwen3MoeAdapter


class Qwen2MoeAdapter(Qwen3MoeAdapter):
    family = "qwen2_moe"

    def shared(self, block, x: torch.Tensor) -> torch.Tensor:
        # Qwen2MoeSparseMoeBlock.forward's shared path, through the block's own modules.
        return torch.sigmoid(block.shared_expert_gate(x)) * block.shared_expert(x)

    def shared_modules(self, block) -> list:
        return [block.shared_expert, block.shared_expert_gate]

    def tiny_config(self, arch, base):
        """Layer 0 dense, as the Qwen3-MoE tiny model's; a shared expert twice as wide."""
        from transformers import Qwen2MoeConfig

        return Qwen2MoeConfig(
            **base,
            intermediate_size=2 * arch["intermediate_size"],
            moe_intermediate_size=arch["intermediate_size"],
            shared_expert_intermediate_size=2 * arch["intermediate_size"],
            num_experts=arch["num_experts"],
            norm_topk_prob=False,
            mlp_only_layers=[0],
        )
