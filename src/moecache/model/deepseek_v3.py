"""DeepSeek-V3 (deepseek-ai/DeepSeek-V3, Moonlight, Kimi-K2 alike): DeepSeek-V2's layout
(dense first layers, shared experts always resident), with a sigmoid router: scores =
sigmoid(logits); the choice adds `e_score_correction_bias`; the best `topk_group` of
`n_group` groups (by the sum of their two best) are kept; top-k; the weights are the
unbiased scores, renormalised when `norm_topk_prob`, times `routed_scaling_factor`.
Restricted, the group choice is the model's own and the disallowed experts are masked at
the final top-k (as DeepSeek-V2's adapter); where the chosen groups hold fewer than k allowed
experts the group limit is lifted rather than compute an expert that is not resident."""

from __future__ import annotations

import torch

from moecache.model.adapter import NEG_INF
from moecache.model.deepseek_v2 import DeepseekV2Adapter, in_groups


class DeepseekV3Adapter(DeepseekV2Adapter):
    family = "deepseek_v3"
    unsupported_stages = {
        **DeepseekV2Adapter.unsupported_stages,
        "controller": "the controller restricts routing by scaling softmax probabilities "
        "(p * m); DeepSeek-V3 selects on biased sigmoid scores",
    }

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.float().sigmoid()

    def restrict(self, block, logits, allowed):
        router = self.router(block)
        scores = self.probabilities(logits)
        choice = scores + router.e_score_correction_bias.to(scores.device)
        groups = choice.view(-1, router.num_group, router.num_experts // router.num_group)
        chosen = groups.topk(2, dim=-1).values.sum(dim=-1).topk(router.topk_group, dim=-1).indices
        grouped = in_groups(choice, chosen, router.num_group)
        enough = (grouped & allowed).sum(dim=-1, keepdim=True) >= router.top_k
        choice = choice.masked_fill(~allowed | (~grouped & enough), NEG_INF)
        index = choice.topk(router.top_k, dim=-1).indices
        weights = scores.gather(1, index)
        if router.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * router.routed_scaling_factor, index
