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
