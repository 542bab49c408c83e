"""Tiny randomly initialised models of every family with an adapter, from transformers'
own config classes, at the sizes of a config's `model.architecture`: the embedded default
(OLMoE), the offline rehearsals of the paper-scale configs, the exactness tests and the GPU
check. `save_pretrained` writes them in the hub's on-disk layout (safetensors, one tensor per
expert and projection where the hub has them so)."""

from __future__ import annotations

import torch

from moecache.errors import MoecacheError


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


def olmoe(arch, base):
    from transformers import OlmoeConfig

    return OlmoeConfig(
        **base,
        intermediate_size=arch["intermediate_size"],
        num_experts=arch["num_experts"],
        norm_topk_prob=False,
        router_aux_loss_coef=0.01,
    )


def mixtral(arch, base):
    from transformers import MixtralConfig

    return MixtralConfig(
        **base, intermediate_size=arch["intermediate_size"], num_local_experts=arch["num_experts"]
    )


def qwen3_moe(arch, base):
    """Layer 0 dense (mlp_only_layers), as some Qwen checkpoints have, to keep the check
    that refuses a dense restricted layer honest; top-k weights renormalised, as published."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        **base,
        intermediate_size=2 * arch["intermediate_size"],
        moe_intermediate_size=arch["intermediate_size"],
        num_experts=arch["num_experts"],
        norm_topk_prob=True,
        mlp_only_layers=[0],
        head_dim=arch["hidden_size"] // arch["num_attention_heads"],
    )


def qwen2_moe(arch, base):
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(
        **base,
        intermediate_size=2 * arch["intermediate_size"],
        moe_intermediate_size=arch["intermediate_size"],
        shared_expert_intermediate_size=2 * arch["intermediate_size"],
        num_experts=arch["num_experts"],
        norm_topk_prob=False,
        mlp_only_layers=[0],
    )


def deepseek(arch) -> dict:
    """DeepSeek's MLA attention at tiny sizes, one dense first layer, one shared expert."""
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


def deepseek_v2(arch, base):
    from transformers import DeepseekV2Config

    return DeepseekV2Config(**base, **deepseek(arch), topk_method="greedy")


def deepseek_v3(arch, base):
    """Group-limited routing over 4 groups, the best 2 kept, with a random correction bias
    set by `init_bias` after the weights exist."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        **base,
        **deepseek(arch),
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
    )


def gpt_oss(arch, base):
    from transformers import GptOssConfig

    return GptOssConfig(
        **base,
        intermediate_size=arch["intermediate_size"],
        num_local_experts=arch["num_experts"],
        head_dim=arch["hidden_size"] // arch["num_attention_heads"],
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"] * (arch["num_hidden_layers"] // 2)
        + ["full_attention"] * (arch["num_hidden_layers"] % 2),
    )


CONFIGS = {
    "olmoe": olmoe,
    "mixtral": mixtral,
    "qwen2_moe": qwen2_moe,
    "qwen3_moe": qwen3_moe,
    "deepseek_v2": deepseek_v2,
    "deepseek_v3": deepseek_v3,
    "gpt_oss": gpt_oss,
}


def config(family: str, arch: dict, vocab_size: int, tok=None, **keys):
    """transformers' config of `family` at `arch`'s sizes, with any of its `keys` changed
    (DeepSeek-V2's group-limited routing and scaling, say)."""
    if family not in CONFIGS:
        raise MoecacheError(f"no tiny {family!r} model; families: {', '.join(sorted(CONFIGS))}")
    built = CONFIGS[family](arch, common(arch, vocab_size, tok))
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
    from moecache.model import registry

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
