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
from moecache import gpu
from moecache.model import checkpoint, memory, registry, tiny
from moecache.schedule import runs

# Published config.json files of the paper-scale checkpoints, for planning offline.
PUBLISHED = Path(__file__).resolve().parents[3] / "config" / "checkpoints"


def checkpoint_config(settings: dict, source: str | None = None):
    """The checkpoint's transformers config: `source`'s when given (a job's model folder),
    the embedded model's from the config, a local or cached checkpoint's own, else the
    published copy in config/checkpoints/."""
    model = settings["model"]
    if hasattr(source, "model_type"):  # a loaded model's own config
        return source
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
    (DeepSeek's MLA caches its compressed latent, one kv_lora_rank vector and the shared
    rotary key of qk_rope_head_dim, expanded per head only after the cache read;
    sliding-window layers are counted in full, an upper bound)."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    if hasattr(config, "qk_rope_head_dim"):  # DeepSeek's MLA
        per_layer = config.kv_lora_rank + config.qk_rope_head_dim
    else:
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )
        per_layer = 2 * heads * head_dim
    return config.num_hidden_layers * per_layer * element


def account(
    settings: dict, gpu_gib=None, source=None, tokens=None, reference=True, shard=None
) -> dict:
    """`source`: the model folder a job loads (default: the config's); `tokens`: the
    longest sequence (default: the config's held-out max_tokens); `reference`: with each
    job's peaks (job_peaks), which asks whether the all-resident reference fits; `shard`:
    the first shard, whose decode job those peaks size (default: the config's)."""
    config = checkpoint_config(settings, source)
    model = settings["model"]
    checkpoint.check_architecture(
        config, model["architecture"], model["source"], configs.family(settings)
    )
    harness = settings["harness"]
    element = torch.empty(0, dtype=checkpoint.DTYPES[model["dtype"]]).element_size()
    report = {
        "source": str(source) if isinstance(source, (str, Path)) else model["source"],
        "dtype": model["dtype"],
        **held(config, harness["restricted_layers"], harness["capacity"], element),
    }
    report.update(loading(config, report, source))
    report["kv_cache_tokens"] = tokens or settings["corpus"]["heldout"]["max_tokens"]
    report["kv_cache_bytes"] = kv_bytes_per_token(config, element) * report["kv_cache_tokens"]
    report["device_bytes"] = report["held_bytes"] + report["kv_cache_bytes"]
    vocab = config.get_text_config().vocab_size
    report["nll_check_bytes"] = memory.nll_check_bytes(report["kv_cache_tokens"], vocab, element)
    from moecache.model import quantized  # transformers' kernels, once a plan is asked for

    report["dequantized_bytes"] = quantized.dequantized_bytes(config, element)
    shards = settings.get("corpus", {}).get("heldout", {}).get("shards")
    shard = shard or next(iter(shards or []), None)  # the first shard decodes most
    if reference and shard is not None:  # the jobs' peaks need the runs a shard decodes
        report.update(job_peaks(settings, report, shard))
    if gpu_gib is not None:
        report["gpu_gib"] = gpu_gib
        report["fits"] = report["device_peak_bytes"] <= gpu_gib * 2**30
    return report


def job_peaks(settings: dict, report: dict, shard: str) -> dict:
    """Each harness job's device and host peak, as the accountant (model/memory.py) counts
    them, and the largest: the gates (every lossless gate run on one shared storage, the
    all-resident run's N slots where it is kept, beside one layer's own experts staged on a
    GPU and a KV cache per arm decoded at once; then, the slots given back, the
    whole-sequence NLL check) and the first shard's decode (the model's own base NLL check
    with one layer staged, then the slots of schedule/runs.py's slot_layout, as
    harness/runs.py decodes them, a KV cache per arm decoded at once; the slower link's
    rings once a scaled run repeats a copy)."""
    harness = settings["harness"]
    layers, n = len(report["offloaded_layers"]), report["num_experts"]
    expert, cuda = report["expert_bytes"], gpu.cuda_path(harness["device"])
    staged = n if cuda else 0  # on a CPU the own block reads the host copy in place
    ring, host_ring = ring_bytes(harness, expert, layers)

    def device(slots, staged, ring, caches=1):
        held = memory.device_peak(
            report["weights_bytes"], expert, slots, staged, ring, caches * report["kv_cache_bytes"]
        )
        return held + report["dequantized_bytes"]  # a stored expert as the kernel computes it

    kept = reference_left_out(settings) is None
    gate_slots = max(harness["capacity"], n if kept else 0) * layers
    slots = runs.shard_slots(settings, shard, shard, kept)
    shared, groups = runs.slot_layout(slots)
    # A scaled group decodes its twin and each multiplier token by token: a cache each.
    arms = [1 + len(group) for group in runs.scaled_groups(slots).values()]
    if not groups:  # the link's rings are made by the first repeated copy: none at 1x
        ring = host_ring = 0
    nll_check = device(0, staged, 0) + report["nll_check_bytes"]
    jobs = {
        "gates": max(
            device(gate_slots, staged, 0, caches=2 if kept else 1),  # own block beside C = N
            nll_check,  # the slots given back
        ),
        "decode": max(
            nll_check,  # the model's own base NLL, before any slot
            device(shared * layers, 0, 0),  # the 1x runs, one after another
            *(device(g * layers, 0, ring, a) for g, a in zip(groups, arms, strict=True)),
        ),
    }
    # The gates run at 1x: only the decode job's scaled runs make the link's host ring.
    hosts = {
        "gates": report["pinned_host_bytes"],
        "decode": report["pinned_host_bytes"] + host_ring,
    }
    # Each job first loads its model (`loading`): its host peak is the larger phase's.
    phases = {"load": report["host_load_peak_bytes"], **hosts}
    return {
        "reference_kept": kept,
        "job_device_peak_bytes": jobs,
        "device_peak_bytes": max(jobs.values()),
        "job_host_peak_bytes": hosts,
        "host_peak_bytes": max(hosts.values()),
        "host_phase_peak_bytes": phases,
        "host_ram_bytes": max(phases.values()),
    }


def loading(config, report: dict, source=None) -> dict:
    """The host memory of a job's load phase (model/checkpoint.py load_host_peak): the
    checkpoint's safetensors files (a local checkpoint's own sizes, else its weights as
    stored: quantized experts at their stored bytes) mapped while transformers reads them,
    beside the routed experts, read into place where transformers would fuse them from
    per-expert tensors (model/expert_reader.py), else fused by it (a pair's stacks while it
    fuses them: a quantized checkpoint's, dequantized). Placing adds nothing: the
    offloaded experts are pinned where they lie (gpu.pin_in_place), and the other weights
    leave host memory for the device."""
    from moecache.model import expert_reader

    files = checkpoint.file_bytes(source) if isinstance(source, (str, Path)) else None
    layers = report.pop("moe_expert_param_bytes")
    if files is None:
        files = report["total_weights_bytes"]
        if report["stored_expert_bytes"]:  # stored experts, not their dequantized bytes
            dense = sum(sum(params.values()) for params in layers)
            files += report["stored_expert_bytes"] * report["num_experts"] * len(layers) - dense
    cast = stored_dtype(config) not in (None, report["dtype"])
    if cast:  # each tensor cast into a new one as it is read: the mapped files let go
        files = report["total_weights_bytes"] - sum(sum(params.values()) for params in layers)
    chunk = expert_reader.READ_CHUNK_BYTES if cast else 0
    read = expert_reader.reads(config)
    return checkpoint.load_host_peak(files, layers, config.model_type, read, chunk)


def stored_dtype(config) -> str | None:
    """The dtype the checkpoint stores its weights in (its config's `dtype`), by name."""
    dtype = getattr(config, "dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else None


def ring_bytes(harness: dict, expert: int, layers: int) -> tuple[int, int]:
    """The slower link's device and host rings (harness/link.py SlowLink; none but on CUDA's
    `ring` kind), for C slots per offloaded layer, sized as SlowLink sizes them."""
    if memory.slow_link_kind(harness["slow_link"], harness["device"]) != "ring":
        return 0, 0
    ring_mib = memory.ring_mib(harness)
    host, device = memory.ring_blocks(ring_mib, expert, harness["capacity"] * layers)
    return device * expert, host * expert


def reference_device_bytes(settings: dict, source=None, tokens=None) -> int:
    """The device memory the all-resident reference needs: every expert of the offloaded
    layers in its slots, beside the resident weights and the KV cache (`source`, `tokens`:
    as account's)."""
    report = account(settings, source=source, tokens=tokens, reference=False)
    layers = len(report["offloaded_layers"])
    return memory.device_peak(
        report["weights_bytes"],
        report["expert_bytes"],
        report["num_experts"] * layers,
        0,
        0,  # at 1x: no slower link's ring
        report["kv_cache_bytes"],
    )


def reference_left_out(settings: dict) -> str | None:
    """Why the all-resident reference cannot run within the configured device memory
    (harness.device_gib), in one line; None where it fits or no size is configured."""
    gib = settings["harness"].get("device_gib")
    if gib is None:
        return None
    need = reference_device_bytes(settings)
    if need <= gib * 2**30:
        return None
    return (
        f"all-resident reference left out: every expert of the offloaded layers on the "
        f"device needs {need / 2**30:.1f} GiB, harness.device_gib is {gib:g}"
    )


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

    # transformers loads some weights in float32 whatever the dtype (a family's
    # _keep_in_fp32_modules_strict: DeepSeek's router weight and correction bias).
    kept = getattr(model, "_keep_in_fp32_modules_strict", None) or []
    nbytes = {
        id(p): p.numel() * (max(element, 4) if any(k in name for k in kept) else element)
        for name, p in model.named_parameters()
    }

    def count(modules) -> int:
        return sum(nbytes[id(p)] for m in modules for p in m.parameters())

    offloaded = [adapter.layer_experts(model, layer) for layer in layers]
    moe_experts = [adapter.layer_experts(model, layer) for layer in sizes.moe_layers]
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
        "total_weights_bytes": count([model]),
        "stored_expert_bytes": stored,
        # Each MoE layer's expert parameters as loaded, for the load phase (`loading`).
        "moe_expert_param_bytes": [
            {name: nbytes[id(p)] for name, p in m.named_parameters(recurse=False)}
            for m in moe_experts
        ],
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
    if "device_peak_bytes" in report:
        jobs = ", ".join(
            f"{job} {b / 2**30:.3f} GiB" for job, b in report["job_device_peak_bytes"].items()
        )
        reference = "kept" if report["reference_kept"] else "left out (harness.device_gib)"
        out += [
            f"  device peak: {gib('device_peak_bytes')} ({jobs}; the all-resident "
            f"reference {reference})",
            f"  host peak: {gib('host_peak_bytes')} while decoding; "
            f"{gib('host_load_peak_bytes')} while loading (the checkpoint's files "
            f"{gib('checkpoint_file_bytes')}, the experts read in place "
            f"{gib('read_experts_bytes')}, the experts transformers fuses "
            f"{gib('fused_experts_bytes')} and one pair's stacks {gib('fusing_stacks_bytes')})",
        ]
    if "fits" in report:
        verdict = "peak fits" if report["fits"] else "peak does NOT fit"
        out.append(f"  {verdict} a {report['gpu_gib']:g} GiB GPU")
    return out
