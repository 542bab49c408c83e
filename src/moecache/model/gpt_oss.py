"""GPT-OSS (openai/gpt-oss-20b, -120b): every layer sparse, the router at `mlp.router`
with a bias; it takes the top-k logits first and a softmax over those k (so the weights
always sum to one); the experts are fused and transposed with biases (`gate_up_proj`
[E, H, 2I] with gate and up interleaved, `down_proj` [E, I, H]); the block returns
(hidden, router scores). Restricted, the disallowed experts' logits are masked before the
top-k, so the softmax runs over the allowed top k."""

from __future__ import annotations

import torch

from moecache.model.adapter import NEG_INF, MoeAdapter


class GptOssAdapter(MoeAdapter):
    family = "gpt_oss"
    router_attr = "router"
    hub_expert = "model.layers.{layer}.mlp.experts.gate_up_proj"  # fused on the hub too
    unsupported_stages = {
        "controller": "the controller restricts routing by scaling softmax probabilities "
        "(p * m); GPT-OSS selects on raw logits and takes its softmax over the chosen k",
        "router_tuning": "peft cannot wrap GPT-OSS's biased, transposed fused experts",
    }

    def num_experts(self, config) -> int:
        return config.num_local_experts

    def tiny_config(self, arch, base):
        """Sliding-window and full attention layers alternating, as published."""
        from transformers import GptOssConfig

        layers = arch["num_hidden_layers"]
        return GptOssConfig(
            **base,
            intermediate_size=arch["intermediate_size"],
            num_local_experts=arch["num_experts"],
            head_dim=arch["hidden_size"] // arch["num_attention_heads"],
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention"] * (layers // 2)
            + ["full_attention"] * (layers % 2),
        )

    def restrict(self, block, logits, allowed):
        top, index = logits.masked_fill(~allowed, NEG_INF).topk(self.top_k(block), dim=-1)
        return torch.softmax(top.float(), dim=1), index

    def renormalises(self, block) -> bool:
        return True

    def output(self, hidden, weights):
        return hidden, weights  # GptOssDecoderLayer unpacks (hidden, router scores)
