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
    unsupported_stages = {
        "controller": "the controller restricts routing by scaling softmax probabilities "
        "(p * m); GPT-OSS selects on raw logits and takes its softmax over the chosen k",
        "router_tuning": "peft cannot wrap GPT-OSS's biased, transposed fused experts",
    }

    def num_experts(self, config) -> int:
        return config.num_local_experts

    def restrict(self, block, logits, allowed):
        top, index = logits.masked_fill(~allowed, NEG_INF).topk(self.top_k(block), dim=-1)
        return torch.softmax(top.float(), dim=1), index

    def renormalises(self, block) -> bool:
        return True

    def output(self, hidden, weights):
        return hidden, weights  # GptOssDecoderLayer unpacks (hidden, router scores)
