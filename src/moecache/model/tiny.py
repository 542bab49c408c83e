"""Tiny randomly initialised models of every family with an adapter, from transformers'
own config classes (each adapter's tiny_config), at the sizes of a config's
`model.architecture`: the embedded default (OLMoE), the offline rehearsals of the
paper-scale configs, the exactness tests and the GPU check. `save_pretrained` writes them
in the hub's on-disk layout (safetensors, one tensor per expert and projection where the
hub has them so)."""

from __future__ import annotations

import torch

from moecache.errors import MoecacheError
from moecache.model import registry


def common(arch: dict, vocab_size: int, tok=None) -> dict:
    ids = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    if tok is not None:
        ids = {
            "bos_token_id": tok.bos_token_id,
            "eos_token_id": tok.eos_token_id,
            "pad_token_id": tok.pad_token_id,
        }
    return {
        "vocab_size": vocab_size,
        "hidden_size": arch["hidden_size"],
        "num_hidden_layers": arch["num_hidden_layers"],
        "num_attention_heads": arch["num_attention_heads"],
        "num_key_value_heads": arch["num_attention_heads"],
        "max_position_embeddings": arch["max_position_embeddings"],
        "num_experts_per_tok": arch["num_experts_per_tok"],
        "tie_word_embeddings": False,
        **ids,
    }


def config(family: str, arch: dict, vocab_size: int, tok=None, **keys):
    """transformers' config of `family` at `arch`'s sizes, from its adapter's tiny_config,
    with any of its `keys` changed (DeepSeek-V2's group-limited routing and scaling, say)."""
    if family not in registry.ADAPTERS:
        raise MoecacheError(
            f"no tiny {family!r} model; families: {', '.join(sorted(registry.ADAPTERS))}"
        )
    built = registry.adapter_for(family).tiny_config(arch, common(arch, vocab_size, tok))
    built.update(keys)
    return built


def model(family: str, arch: dict, vocab_size: int, seed: int, tok=None, **keys):
    """A seeded random model of `family` on the CPU, float32, in eval mode (`keys`: config
    keys changed, as for config()). Routers start at zero in some families' init; they are
    drawn at random here so that routing varies."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    built = AutoModelForCausalLM.from_config(config(family, arch, vocab_size, tok, **keys))
    built = built.eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in built.named_parameters():
            if name.endswith(("gate.weight", "router.weight")) and p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=generator))
            elif name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
        for name, buffer in built.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's
                buffer.copy_(torch.rand(buffer.shape, generator=generator) * 0.1)
    return built


def experts(family: str, layer: dict, dtype, seed: int, implementation=None):
    """One layer's fused experts module of `family` at `layer`'s sizes (the keys of a
    config's `model.architecture`), on the host, seeded N(0, 0.02) weights in `dtype`,
    allocated once (no init pass over paper-sized tensors)."""
    from transformers import AutoModelForCausalLM

    from moecache.model import kernel as _  # noqa: F401  (registers the per-expert kernel)

    arch = {**layer, "num_hidden_layers": 2, "num_attention_heads": 1}
    arch.setdefault("max_position_embeddings", 8)
    built = config(family, arch, vocab_size=8)
    if implementation:
        built._experts_implementation = implementation
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(built)
    adapter = registry.adapter_for(family)
    module = adapter.layer_experts(model, adapter.sizes(built).moe_layers[0])
    generator = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters(recurse=False):
        weights = torch.randn(p.shape, dtype=dtype, generator=generator).mul_(0.02)
        setattr(module, name, torch.nn.Parameter(weights, requires_grad=False))
    return module
