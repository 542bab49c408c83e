"""DeepSeek-V2 (deepseek-ai/DeepSeek-V2-Lite): the first `first_k_dense_replace` layers
dense, then sparse blocks of `n_routed_experts` routed experts plus `n_shared_experts`
shared ones (`mlp.shared_experts`, always resident, never offloaded). The router at
`mlp.gate` takes a softmax in float32, then top-k, greedily or group-limited (the best
`topk_group` groups by their best expert), never renormalised, scaled by
`routed_scaling_factor`; its top-k is unsorted (`sorted=False`), so a request is reordered
most probable first (the block's sum is the same in any order).

Restricted, the groups are ranked by their best allowed expert (a group without one comes
last), so the allowed experts of the best allowed groups are chosen; where those groups
hold fewer than k allowed experts the group limit yields and the top k allowed experts are
chosen, rather than fill the top-k with zero-weight experts. A resident set that holds the
requested experts gives the request back (Dwell-1's gate): their groups rank first. The
controller's soft mixture (`mix`) ranks groups by the scores scaled by membership; at
membership 1 that is the model's own routing.
"""

from __future__ import annotations

import torch

from moecache.model.adapter import NEG_INF, MoeAdapter


def tiny_deepseek(arch: dict) -> dict:
    """DeepSeek's MLA attention at a tiny model's sizes, one dense first layer, one shared
    expert (V2's and V3's tiny configs)."""
    head = arch["hidden_size"] // arch["num_attention_heads"]
    return {
        "intermediate_size": 2 * arch["intermediate_size"],
        "moe_intermediate_size": arch["intermediate_size"],
        "n_routed_experts": arch["num_experts"],
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "kv_lora_rank": 16,
        "q_lora_rank": None,
        "qk_rope_head_dim": head // 2,
        "qk_nope_head_dim": head // 2,
        "v_head_dim": head,
        "rope_interleave": True,
    }


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

    def tiny_config(self, arch, base):
        from transformers import DeepseekV2Config

        return DeepseekV2Config(**base, **tiny_deepseek(arch), topk_method="greedy")

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.float().softmax(dim=-1, dtype=torch.float32)

    def most_probable_first(self, weights, index):
        order = weights.argsort(dim=-1, descending=True, stable=True)
        return weights.gather(-1, order), index.gather(-1, order)

    def restrict(self, block, logits, allowed):
        router = self.router(block)
        scores = self.probabilities(logits)
        if router.topk_method == "group_limited_greedy":
            scores = scores.masked_fill(~self.group_limit(router, scores, allowed), 0.0)
        top, index = scores.masked_fill(~allowed, NEG_INF).topk(router.top_k, dim=-1)
        return top * router.routed_scaling_factor, index

    def mix(self, block, logits, member):
        router = self.router(block)
        scores = self.probabilities(logits) * member
        if router.topk_method == "group_limited_greedy":
            scores = scores.masked_fill(~self.group_limit(router, scores, member > 0), 0.0)
        top, index = scores.topk(router.top_k, dim=-1)
        return top * router.routed_scaling_factor, index

    def group_limit(self, router, scores, allowed) -> torch.Tensor:
        """[T, N] bool: the experts of the `topk_group` groups that score best over their
        allowed experts (the model's own groups when every expert is allowed); every expert
        where those groups hold fewer than k allowed ones."""
        ranked = self.group_scores(router, scores, allowed)
        chosen = ranked.topk(router.topk_group, dim=-1).indices
        grouped = in_groups(chosen, router.num_group, router.num_experts)
        return grouped | ((grouped & allowed).sum(dim=-1, keepdim=True) < router.top_k)

    def group_scores(self, router, scores, allowed) -> torch.Tensor:
        """[T, groups]: each group's best allowed expert's score (-inf: none allowed)."""
        return allowed_by_group(router, scores, allowed).max(dim=-1).values

    def renormalises(self, block) -> bool:
        return False

    def shared(self, block, x: torch.Tensor) -> torch.Tensor:
        return block.shared_experts(x)

    def shared_modules(self, block) -> list:
        return [block.shared_experts]


def allowed_by_group(router, scores, allowed) -> torch.Tensor:
    """[T, groups, experts per group]: the scores, -inf where not allowed."""
    size = router.num_experts // router.num_group
    return scores.masked_fill(~allowed, NEG_INF).view(-1, router.num_group, size)


def in_groups(chosen: torch.Tensor, num_group: int, num_experts: int) -> torch.Tensor:
    """[T, N] bool: the experts of each token's `chosen` groups [T, g]."""
    mask = torch.zeros(chosen.shape[0], num_group, dtype=torch.bool, device=chosen.device)
    mask.scatter_(1, chosen, True)
    return mask.repeat_interleave(num_experts // num_group, dim=1)
