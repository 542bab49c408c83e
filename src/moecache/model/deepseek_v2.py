"""DeepSeek-V2 (deepseek-ai/DeepSeek-V2-Lite): the first `first_k_dense_replace` layers
dense, then sparse blocks of `n_routed_experts` routed experts plus `n_shared_experts`
shared ones (`mlp.shared_experts`, always resident, never offloaded). The router at
`mlp.gate` takes a softmax in float32, then top-k, greedily or group-limited (the best
`topk_group` groups by their best expert), never renormalised, scaled by
`routed_scaling_factor`. Restricted, the group choice is the model's own (over every
expert's score, as the router computes it) and the disallowed experts are masked at the
final top-k, so a resident set that holds the requested experts gives the request back
(Dwell-1's gate). Where the chosen groups hold fewer than k allowed experts the router's own
zero-fill lets allowed experts of other groups in, at weight zero, as the model would.
"""

from __future__ import annotations

import torch

from moecache.model.adapter import NEG_INF, MoeAdapter


class DeepseekV2Adapter(MoeAdapter):
    family = "deepseek_v2"
    unsupported_stages = {
        "router_tuning": "DeepSeek's attention (MLA) has no q_proj/k_proj/v_proj/o_proj "
        "set that the router-tuning LoRA targets",
    }

    def num_experts(self, config) -> int:
        return config.n_routed_experts

    def expert_intermediate_size(self, config) -> int:
        return config.moe_intermediate_size

    def moe_layers(self, config) -> list[int]:
        return list(range(config.first_k_dense_replace, config.num_hidden_layers))

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.float().softmax(dim=-1, dtype=torch.float32)

    def restrict(self, block, logits, allowed):
        router = self.router(block)
        scores = self.probabilities(logits)
        if router.topk_method == "group_limited_greedy":
            groups = scores.view(-1, router.num_group, router.num_experts // router.num_group)
            chosen = groups.max(dim=-1).values.topk(router.topk_group, dim=-1).indices
            scores = scores.masked_fill(~in_groups(scores, chosen, router.num_group), 0.0)
        top, index = scores.masked_fill(~allowed, NEG_INF).topk(router.top_k, dim=-1)
        return top * router.routed_scaling_factor, index

    def renormalises(self, block) -> bool:
        return False

    def shared(self, block, x: torch.Tensor) -> torch.Tensor:
        return block.shared_experts(x)

    def shared_modules(self, block) -> list:
        return [block.shared_experts]


def in_groups(scores, chosen, num_group: int) -> torch.Tensor:
    """[T, N] bool: the experts of each token's `chosen` groups."""
    mask = torch.zeros(scores.shape[0], num_group, dtype=torch.bool, device=scores.device)
    mask.scatter_(1, chosen, True)
    return mask.repeat_interleave(scores.shape[1] // num_group, dim=1)
