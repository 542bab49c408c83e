"""DeepSeek-V3 (deepseek-ai/DeepSeek-V3, Moonlight, Kimi-K2 alike): DeepSeek-V2's layout
(dense first layers, shared experts always resident), with a sigmoid router: scores =
sigmoid(logits); the choice adds `e_score_correction_bias`; the best `topk_group` of
`n_group` groups (by the sum of their two best) are kept; top-k, unsorted; the weights are
the unbiased scores, renormalised when `norm_topk_prob`, times `routed_scaling_factor`. A
request is reordered by those weights, most probable first.

Restricted, the model's own groups are kept where they hold k allowed experts: a group's
score reads its second-best expert, which need not be resident, so ranking groups over the
allowed experts alone could drop the group of a requested expert, and a resident set
holding the requested experts must give the request back (Dwell-1's gate). Where the
model's groups hold fewer, the groups are ranked as DeepSeek-V2's adapter ranks them, over
the allowed experts (the sum of a group's two best allowed choice scores, its one allowed
expert's alone where it holds one, a group without any last), and where those too hold
fewer than k allowed experts the group limit yields rather than compute an expert that is
not resident. The controller refuses this family: its soft mixture scales softmax
probabilities, and V3 selects on biased sigmoid scores."""

from __future__ import annotations

import torch

from moecache.model.adapter import NEG_INF
from moecache.model.deepseek_v2 import DeepseekV2Adapter, allowed_by_group, tiny_deepseek


class DeepseekV3Adapter(DeepseekV2Adapter):
    family = "deepseek_v3"
    unsupported_stages = {
        **DeepseekV2Adapter.unsupported_stages,
        "controller": "the controller restricts routing by scaling softmax probabilities "
        "(p * m); DeepSeek-V3 selects on biased sigmoid scores",
    }

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.float().sigmoid()

    def tiny_config(self, arch, base):
        """Group-limited routing over 4 groups, the best 2 kept, with a random correction
        bias set by tiny.model after the weights exist."""
        from transformers import DeepseekV3Config

        return DeepseekV3Config(
            **base,
            **tiny_deepseek(arch),
            n_group=4,
            topk_group=2,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
        )

    def restrict(self, block, logits, allowed):
        router = self.router(block)
        scores = self.probabilities(logits)
        choice = scores + router.e_score_correction_bias.to(scores.device)
        selectable = allowed & self.group_limit(router, choice, allowed)
        top = choice.masked_fill(~selectable, NEG_INF).topk(router.top_k, dim=-1)
        weights = scores.gather(1, top.indices)
        if router.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        weights = weights * router.routed_scaling_factor
        # Most probable first; an expert taken from outside `allowed` (fewer than k there) last.
        order = weights.masked_fill(top.values == NEG_INF, -1.0).argsort(
            dim=-1, descending=True, stable=True
        )
        return weights.gather(1, order), top.indices.gather(1, order)

    def group_limit(self, router, choice, allowed) -> torch.Tensor:
        """[T, N] bool: the model's own groups where they hold k allowed experts, else the
        groups ranked over the allowed experts (DeepSeek-V2's rule)."""
        everything = torch.ones_like(choice, dtype=torch.bool)
        own = super().group_limit(router, choice, everything)
        enough = (own & allowed).sum(dim=-1, keepdim=True) >= router.top_k
        return torch.where(enough, own, super().group_limit(router, choice, allowed))

    def group_scores(self, router, choice, allowed) -> torch.Tensor:
        """[T, groups]: the sum of each group's two best allowed experts' choice scores
        (the model's own group score when every expert is allowed)."""
        best = allowed_by_group(router, choice, allowed).topk(2, dim=-1).values
        held = best > NEG_INF
        return best.masked_fill(~held, 0.0).sum(dim=-1).masked_fill(~held.any(dim=-1), NEG_INF)
