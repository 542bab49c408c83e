"""Mixtral (mistralai/Mixtral-8x7B-Instruct-v0.1): 8 experts, top-2, every layer sparse, a
softmax router at `mlp.gate` whose top-k weights are always renormalised, no shared
experts. On the hub the experts are stored per expert as `block_sparse_moe.experts.E.w1/w2/w3`;
transformers fuses them into `mlp.experts` on load."""

from __future__ import annotations

from moecache.model.adapter import MoeAdapter


class MixtralAdapter(MoeAdapter):
    family = "mixtral"
    hub_expert = "model.layers.{layer}.block_sparse_moe.experts.{expert}.w1.weight"

    def tiny_config(self, arch, base):
        from transformers import MixtralConfig

        return MixtralConfig(
            **base,
            intermediate_size=arch["intermediate_size"],
            num_local_experts=arch["num_experts"],
        )

    def renormalises(self, block) -> bool:
        return True  # MixtralTopKRouter always divides by the top-k sum
