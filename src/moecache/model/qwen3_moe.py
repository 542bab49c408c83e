"""Qwen3-MoE (Qwen/Qwen3-30B-A3B): 128 experts, top-8, a softmax router at `mlp.gate`
whose top-k weights are renormalised when `norm_topk_prob` is on (it is, in the published
checkpoints), and no shared experts. A layer is sparse unless it is listed in
`mlp_only_layers` or falls between `decoder_sparse_step`s, as transformers decides."""

from __future__ import annotations

from moecache.model.adapter import MoeAdapter


def sparse_layers(config) -> list[int]:
    """Qwen2-MoE's and Qwen3-MoE's own rule (their decoder layers' __init__)."""
    return [
        layer
        for layer in range(config.num_hidden_layers)
        if layer not in config.mlp_only_layers
        and config.num_experts > 0
        and (layer + 1) % config.decoder_sparse_step == 0
    ]


class Qwen3MoeAdapter(MoeAdapter):
    family = "qwen3_moe"

    def expert_intermediate_size(self, config) -> int:
        return config.moe_intermediate_size

    def moe_layers(self, config) -> list[int]:
        return sparse_layers(config)

    def tiny_config(self, arch, base):
        """Layer 0 dense (mlp_only_layers), as some Qwen checkpoints have, to keep the check
        that refuses a dense restricted layer honest; top-k weights renormalised, as
        published."""
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(
            **base,
            intermediate_size=2 * arch["intermediate_size"],
            moe_intermediate_size=arch["intermediate_size"],
            num_experts=arch["num_experts"],
            norm_topk_prob=True,
            mlp_only_layers=[0],
            head_dim=arch["hidden_size"] // arch["num_attention_heads"],
        )
