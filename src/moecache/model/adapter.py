"""What the harness needs to know about one family of MoE models, and nothing else.

transformers 5 gives every MoE family the same experts interface: an experts module whose
parameters are fused over the expert axis ([N, ...] each) and whose forward takes
(hidden [T, H], top-k index [T, k], top-k weights [T, k]). Families differ in where the
router and experts sit, which decoder layers are sparse, how the router selects and weights
experts, and in shared experts that every token uses. An adapter says those things for one
family, in one file (model/<family>.py), and everything outside `model/` reaches the model
through it. The base class below is the common case: a router at `block.gate` whose
forward returns (logits, top-k weights, top-k ids), a softmax over the logits, top-k, and
optionally the top-k weights renormalised (OLMoE, Qwen2-MoE, Qwen3-MoE).

Restricted routing masks the scores the model selects on, just before its own top-k: the
router then picks what it would pick if the other experts did not exist, and weights them
as it weights any choice (renormalised where the model renormalises, not where it does not).
The controller's training block routes through `mix`, the same selection with each expert's
score scaled by a membership in [0, 1]. A request (`route`) lists its experts most probable
first, as policies read it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from moecache.errors import MoecacheError

NEG_INF = float("-inf")
TINY = 1e-9  # the floor of a soft mixture's renormalising sum


@dataclass(frozen=True)
class Sizes:
    """A checkpoint's MoE sizes, in one vocabulary for every family."""

    hidden_size: int
    intermediate_size: int  # one routed expert's
    num_hidden_layers: int
    num_attention_heads: int
    num_experts: int  # routed experts per MoE layer
    num_experts_per_tok: int
    moe_layers: tuple[int, ...]


class MoeAdapter:
    # transformers' model_type; a subclass that sets it in model/<model_type>.py is that
    # family's adapter, found by the registry (registry.py)
    family = "base"
    router_attr = "gate"  # the router's attribute on the sparse block
    # Stages that need a softmax router (family -> why not), see unsupported().
    unsupported_stages: dict[str, str] = {}
    # Where the family's hub checkpoints store one routed expert's first weight (transformers
    # fuses the experts on load and splits them again on save): the rehearsal builder and
    # the tests check that a saved tiny checkpoint is in the hub's layout.
    hub_expert = "model.layers.{layer}.mlp.experts.{expert}.gate_proj.weight"

    # -- a tiny model of the family, for the tests, the rehearsals and the GPU check
    def tiny_config(self, arch: dict, base: dict):
        """transformers' config of the family at `arch`'s sizes (the keys of a config's
        `model.architecture`; `base`: the keys every family shares, tiny.common), in this
        class's vocabulary: `num_experts` experts of `intermediate_size` each. A family
        whose config names them otherwise, or that has quirks the harness must handle
        (dense layers, shared experts, groups), says so in its own."""
        from transformers import AutoConfig

        return AutoConfig.for_model(
            self.family,
            **base,
            intermediate_size=arch["intermediate_size"],
            num_experts=arch["num_experts"],
        )

    # -- the checkpoint's config, before any weight is loaded
    def sizes(self, config) -> Sizes:
        return Sizes(
            hidden_size=config.hidden_size,
            intermediate_size=self.expert_intermediate_size(config),
            num_hidden_layers=config.num_hidden_layers,
            num_attention_heads=config.num_attention_heads,
            num_experts=self.num_experts(config),
            num_experts_per_tok=config.num_experts_per_tok,
            moe_layers=tuple(self.moe_layers(config)),
        )

    def num_experts(self, config) -> int:
        return config.num_experts

    def expert_intermediate_size(self, config) -> int:
        return config.intermediate_size

    def moe_layers(self, config) -> list[int]:
        """Decoder layers whose MLP is a sparse MoE block."""
        return list(range(config.num_hidden_layers))

    def check_sparse(self, config, layers) -> None:
        """Only a sparse MoE layer can be offloaded (Qwen's mlp_only_layers, DeepSeek's
        first dense layers are not): one line naming the first dense one."""
        sparse = self.moe_layers(config)
        dense = [layer for layer in layers if layer not in sparse]
        if dense:
            raise MoecacheError(
                f"harness.restricted_layers: layer {dense[0]} of this {self.family} model is "
                f"dense, not an MoE layer (MoE layers: {list(sparse)})"
            )

    # -- the loaded model's modules
    def block(self, model, layer: int) -> nn.Module:
        """The sparse MoE block of decoder layer `layer` (what a pooled block replaces)."""
        return model.model.layers[layer].mlp

    def set_block(self, model, layer: int, module: nn.Module) -> None:
        model.model.layers[layer].mlp = module

    def router(self, block) -> nn.Module:
        return getattr(block, self.router_attr)

    def experts(self, block) -> nn.Module:
        return block.experts

    def set_experts(self, block, module: nn.Module) -> None:
        """Put `module` in place of the block's routed experts (quantized.py's stored ones)."""
        block.experts = module

    def layer_experts(self, model, layer: int) -> nn.Module:
        """The fused experts module of decoder layer `layer`."""
        return self.experts(self.block(model, layer))

    def layer_router(self, model, layer: int) -> nn.Module:
        return self.router(self.block(model, layer))

    def block_path(self) -> str:
        """The sparse block's attribute on a decoder layer, for parameter names."""
        return "mlp"

    def lora_parameters(self) -> list[str]:
        """Router and experts parameters peft reaches through `target_parameters`."""
        block = self.block_path()
        return [
            f"{block}.{self.router_attr}.weight",
            f"{block}.experts.gate_up_proj",
            f"{block}.experts.down_proj",
        ]

    # -- routing, exactly as the model computes it
    def route(self, block, x: torch.Tensor):
        """(router logits [T, N], top-k weights [T, k], top-k ids [T, k]), most probable
        first: the model's own router, so transformers still records its logits."""
        logits, weights, index = self.router(block)(x)
        return (logits, *self.most_probable_first(weights, index))

    def most_probable_first(self, weights: torch.Tensor, index: torch.Tensor):
        """The router's top-k (weights, ids) in the order policies read a request, most
        probable first; the common routers' own top-k already is."""
        return weights, index

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """The router's probabilities over all experts, which policies may read."""
        return torch.softmax(logits, dtype=torch.float, dim=-1)

    def restrict(self, block, logits: torch.Tensor, allowed: torch.Tensor):
        """Top-k weights (float32) and ids among the `allowed` experts ([T, N] bool), as
        the model's router would choose with the other experts masked before its top-k."""
        probs = self.probabilities(logits)
        top, index = probs.masked_fill(~allowed, NEG_INF).topk(self.top_k(block), dim=-1)
        if self.renormalises(block):
            top = top / top.sum(dim=-1, keepdim=True)
        return top, index

    def mix(self, block, logits: torch.Tensor, member: torch.Tensor):
        """Top-k weights and ids of the router's choice with each expert's score scaled by
        its membership `member` [T, N] in [0, 1] (the controller's soft cache),
        differentiable in it: with member = 1 the model's own routing, with a 0/1 member
        `restrict`'s among the members."""
        top, index = (self.probabilities(logits) * member).topk(self.top_k(block), dim=-1)
        if self.renormalises(block):
            top = top / top.sum(-1, keepdim=True).clamp_min(TINY)
        return top, index

    def top_k(self, block) -> int:
        return self.router(block).top_k

    def renormalises(self, block) -> bool:
        return bool(self.router(block).norm_topk_prob)

    # -- what the block adds besides the routed experts
    def shared(self, block, x: torch.Tensor) -> torch.Tensor | None:
        """The shared experts' output for tokens `x` [T, H] (None: the family has none).
        Shared experts stay on the device and are never offloaded."""
        return None

    def shared_modules(self, block) -> list[nn.Module]:
        return []

    def output(self, hidden: torch.Tensor, weights: torch.Tensor):
        """What the sparse block returns to its decoder layer."""
        return hidden

    def unsupported(self, stage: str) -> str | None:
        """Why `stage` cannot run on this family (None: it can)."""
        return self.unsupported_stages.get(stage)


def allowed_mask(num_experts: int, allowed, device=None) -> torch.Tensor:
    """[1, N] bool: True for the experts in `allowed`."""
    mask = torch.zeros((1, num_experts), dtype=torch.bool, device=device)
    mask[0, list(allowed)] = True
    return mask
