"""OLMoE (allenai/OLMoE-1B-7B-0125): every decoder layer sparse, 64 experts, top-8, a
softmax router at `mlp.gate` whose top-k weights are not renormalised (norm_topk_prob off),
no shared experts. The base adapter is exactly this family."""

from __future__ import annotations

from moecache.model.adapter import MoeAdapter


class OlmoeAdapter(MoeAdapter):
    family = "olmoe"

    def tiny_config(self, arch, base):
        from transformers import OlmoeConfig

        return OlmoeConfig(
            **base,
            intermediate_size=arch["intermediate_size"],
            num_experts=arch["num_experts"],
            norm_topk_prob=False,
            router_aux_loss_coef=0.01,
        )
