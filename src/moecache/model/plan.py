"""Whether a run fits, from the checkpoint's config alone: the model is built on the meta
device (no weight is read or allocated) and its parameters are counted through the
family's adapter.

Device bytes = the weights that stay on the device (everything but the offloaded layers'
routed experts; shared experts included and also reported apart) + C slots per offloaded
layer + the KV cache of the longest held-out sequence. Pinned host bytes = every routed
expert of the offloaded layers. A quantized checkpoint's offloaded experts count as stored
(MXFP4 blocks and scales, FP8 weights and scale_inv: quantized.expert_bytes), the rest at
the run's dtype, as transformers dequantizes it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from moecache import config as configs
from moecache.model import checkpoint, registry, tiny

# Published config.json files of the paper-scale checkpoints, for planning offline.
PUBLISHED = Path(__file__).resolve().parents[3] / "config" / "checkpoints"


def checkpoint_config(settings: dict, source: str | None = None):
    """The checkpoint's transformers config: `source`'s when given (a job's model folder),
    the embedded model's from the config, a local or cached checkpoint's own, else the
    published copy in config/checkpoints/."""
    model = settings["model"]
    if source is not None:
        return checkpoint.read_config(source)
    source = model["source"]
    if source == "embedded":
        vocab = settings.get("tokenizer", {}).get("vocab_size", 1)
        return tiny.config("olmoe", model["architecture"], vocab)
    published = PUBLISHED / (source.replace("/", "--") + ".json")
    if not Path(source).exists() and published.exists():
        import json

        from transformers import AutoConfig

        keys = json.loads(published.read_text())
        return AutoConfig.for_model(keys.pop("model_type"), **keys)
    return checkpoint.read_config(source)


def kv_bytes_per_token(config, element: int) -> int:
    """Keys and values of one token over every layer, as transformers' cache holds them
    (DeepSeek's MLA caches decompressed per-head keys and values; sliding-window layers are
    counted in full, an upper bound)."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    if hasattr(config, "qk_rope_head_dim"):  # DeepSeek's MLA
        per_layer = config.num_attention_heads * (
            config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim
        )
    else:
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )
        per_layer = 2 * heads * head_dim
    return config.num_hidden_layers * per_layer * element


def plan(settings: dict, gpu_gib=None, source=None, tokens=None) -> dict:
    """`source`: the model folder a job loads (default: the config's); `tokens`: the
    longest sequence (default: the config's held-out max_tokens)."""
    config = checkpoint_config(settings, source)
    model = settings["model"]
    checkpoint.check_architecture(
        config, model["architecture"], model["source"], configs.family(settings)
    )
    harness = settings["harness"]
    element = torch.empty(0, dtype=checkpoint.DTYPES[model["dtype"]]).element_size()
    report = {
        "source": source or model["source"],
        "dtype": model["dtype"],
        **held(config, harness["restricted_layers"], harness["capacity"], element),
    }
    report["kv_cache_tokens"] = tokens or settings["corpus"]["heldout"]["max_tokens"]
    report["kv_cache_bytes"] = kv_bytes_per_token(config, element) * report["kv_cache_tokens"]
    report["device_bytes"] = report["held_bytes"] + report["kv_cache_bytes"]
    if gpu_gib is not None:
        report["gpu_gib"] = gpu_gib
        report["fits"] = report["device_bytes"] <= gpu_gib * 2**30
    return report


def held(config, layers, capacity: int, element: int) -> dict:
    """The weights a run keeps on the device and the slots it adds (`held_bytes`, what the
    harness's Offload.device_bytes reports as weights and slots), the model built on the
    meta device from `config` and counted through its family's adapter."""
    from transformers import AutoModelForCausalLM

    from moecache.model import quantized

    adapter = registry.adapter_for(config.model_type)
    sizes = adapter.sizes(config)
    adapter.check_sparse(config, layers)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)

    def count(modules) -> int:
        return sum(p.numel() for m in modules for p in m.parameters()) * element

    offloaded = [adapter.layer_experts(model, layer) for layer in layers]
    moe_blocks = [adapter.block(model, layer) for layer in sizes.moe_layers]
    shared = [m for block in moe_blocks for m in adapter.shared_modules(block)]
    # A quantized checkpoint's experts as stored (model/quantized.py), else as loaded.
    stored = quantized.expert_bytes(config, element)
    expert_bytes = stored or count(offloaded[:1]) // sizes.num_experts
    report = {
        "family": adapter.family,
        "num_experts": sizes.num_experts,
        "top_k": sizes.num_experts_per_tok,
        "capacity": capacity,
        "offloaded_layers": list(layers),
        "expert_bytes": expert_bytes,
        "weights_bytes": count([model]) - count(offloaded),
        "shared_expert_bytes": count(shared),
        "slot_bytes": expert_bytes * capacity * len(layers),
        "pinned_host_bytes": expert_bytes * sizes.num_experts * len(layers),
    }
    report["held_bytes"] = report["weights_bytes"] + report["slot_bytes"]
    return report


def lines(report: dict) -> list[str]:
    """The plan as a reader wants it, one fact a line."""

    def gib(key):
        return f"{report[key] / 2**30:.3f} GiB"

    out = [
        f"plan: {report['source']} ({report['family']}, {report['dtype']}), "
        f"{report['num_experts']} experts top-{report['top_k']}, C = {report['capacity']} "
        f"on layers {report['offloaded_layers']}",
        f"  one expert: {report['expert_bytes'] / 2**20:.2f} MiB",
        f"  device: {gib('device_bytes')} = weights {gib('weights_bytes')} (shared experts "
        f"{gib('shared_expert_bytes')}) + slots {gib('slot_bytes')} + KV cache "
        f"{gib('kv_cache_bytes')} ({report['kv_cache_tokens']} tokens)",
        f"  pinned host: {gib('pinned_host_bytes')}",
    ]
    if "fits" in report:
        verdict = "fits" if report["fits"] else "does NOT fit"
        out.append(f"  {verdict} a {report['gpu_gib']:g} GiB GPU")
    return out
