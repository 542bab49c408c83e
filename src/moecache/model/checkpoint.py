"""The model under study: transformers' own causal LM of any family with an adapter
(model/registry.py), embedded-tiny or pretrained.

One loading path serves both: the embedded model (an OLMoE) is saved with `save_pretrained`
(safetensors) and read back exactly like `allenai/OLMoE-1B-7B-0125`, `Qwen/Qwen3-30B-A3B`
or any local checkpoint folder.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from moecache.errors import MoecacheError, first_line
from moecache.model import expert_reader, registry
from moecache.model.checkpoint_files import checkpoint_folder

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def embedded_config(arch: dict, tok, router_aux_loss_coef: float):
    """OLMoE's architecture at the sizes of `arch` (OLMoE keeps norm_topk_prob off)."""
    from transformers import OlmoeConfig

    return OlmoeConfig(
        vocab_size=len(tok),
        hidden_size=arch["hidden_size"],
        intermediate_size=arch["intermediate_size"],
        num_hidden_layers=arch["num_hidden_layers"],
        num_attention_heads=arch["num_attention_heads"],
        num_key_value_heads=arch["num_attention_heads"],
        num_experts=arch["num_experts"],
        num_experts_per_tok=arch["num_experts_per_tok"],
        max_position_embeddings=arch["max_position_embeddings"],
        norm_topk_prob=False,
        router_aux_loss_coef=router_aux_loss_coef,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )


ARCH_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_experts",
    "num_experts_per_tok",
)


def read_config(source: str | Path):
    """The checkpoint's transformers config, no weights read."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(source))
    except (OSError, ValueError) as error:
        raise MoecacheError(f"model.source {source}: cannot load ({first_line(error)})") from None


def check_architecture(model_config, arch: dict, source, family: str | None = None):
    """The loaded model must be of the configured family (when one is named) and have the
    sizes the config validated against; returns its adapter."""
    adapter = registry.adapter_for(model_config.model_type)
    if family is not None and model_config.model_type != family:
        raise MoecacheError(
            f"model.family is {family!r} but {source} is {model_config.model_type!r}"
        )
    sizes = adapter.sizes(model_config)
    for key in ARCH_KEYS:
        have = getattr(sizes, key)
        if have != arch[key]:
            raise MoecacheError(
                f"model.architecture.{key}: config says {arch[key]}, {source} has {have}"
            )
    return adapter


def load(
    source: str | Path,
    dtype: str,
    device: str,
    arch: dict,
    experts_implementation=None,
    family=None,
    stored_layers=(),
):
    """Load a causal LM of a family with an adapter from a local folder or a hub id,
    weights via safetensors; `experts_implementation`: transformers' expert kernel (its
    default when None). The routed experts are read into place from the files
    (model/expert_reader.py) where transformers would fuse them. A quantized checkpoint
    (MXFP4, block-scaled FP8) keeps the routed experts of `stored_layers` (the offloaded
    ones) as stored, and the rest is dequantized to `dtype` by transformers
    (model/quantized.py)."""
    from transformers import AutoModelForCausalLM

    from moecache.model import kernel as _  # noqa: F401  (registers the per-expert kernel)
    from moecache.model import quantized

    config = read_config(source)
    adapter = check_architecture(config, arch, source, family)
    kernel = {"experts_implementation": experts_implementation} if experts_implementation else {}
    # Every MoE layer's experts read by expert_reader in place, not fused by transformers.
    # Its load draws from torch's generator for the experts it skips (no_init_weights does
    # not stop that): forked, so a seed set before a load (the controller's heads) draws
    # after it what it drew after transformers' own full load.
    reading = list(adapter.sizes(config).moe_layers) if expert_reader.reads(config) else []
    with unwritten_experts(bool(reading)), torch.random.fork_rng(devices=[]):
        model, info = AutoModelForCausalLM.from_pretrained(
            str(source),
            dtype=DTYPES[dtype],
            use_safetensors=True,
            key_mapping=expert_reader.skipping(reading) or None,
            output_loading_info=True,
            **kernel,
            **quantized.load_kwargs(config),
        )
    if reading:
        check_only_experts_missing(model, adapter, reading, info["missing_keys"], source)
        expert_reader.read(model, adapter, checkpoint_folder(source), reading)
        expert_reader.saves_as_read(model)
    quantized.stored_experts(source, config, adapter, model, list(stored_layers))
    return model.to(device).eval()


@contextlib.contextmanager
def unwritten_experts(skipping: bool):
    """While transformers reads a checkpoint whose routed experts it skips: their
    parameters left uninitialised (expert_reader writes them next; initialising tens of GiB
    at random would take minutes) and its report of the skipped keys unsaid."""
    if not skipping:
        yield
        return
    from transformers.initialization import no_init_weights
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        with no_init_weights():
            yield
    finally:
        logging.set_verbosity(verbosity)


def check_only_experts_missing(model, adapter, layers, missing, source) -> None:
    """Nothing but the skipped experts may be missing: any other weight would be left
    uninitialised."""
    names = {id(p): n for n, p in model.named_parameters()}
    skipped = {
        names[id(p)] for layer in layers for p in adapter.layer_experts(model, layer).parameters()
    }
    other = sorted(set(missing) - skipped)
    if other:
        raise MoecacheError(
            f"model.source {source}: the checkpoint lacks {len(other)} weights ({other[0]}, ...)"
        )


def fused_in_order(model_type: str) -> list[tuple[str, bool]]:
    """The expert parameters transformers fuses from a checkpoint's per-expert tensors
    (the family's conversion mapping, as expert_reader.converters reads it), in the order
    it fuses them within a layer (a layer's keys are read sorted, so the parameter whose
    first source name sorts first goes first), each with whether it joins two stacks
    (both alive beside the result while it does)."""
    sources: dict[str, list[str]] = {}
    for name, (target, _) in expert_reader.converters(model_type).items():
        sources.setdefault(target, []).append(name)
    ordered = sorted(sources.items(), key=lambda item: min(item[1]))
    return [(target, len(names) > 1) for target, names in ordered]


# Small tensors made beside the weights while a checkpoint loads: the rotary frequencies
# and the temporaries computing them (GPT-OSS's YaRN holds 1,152 bytes at its load's peak,
# the mapped files, by the host census) and the generator's state `load` keeps while
# transformers reads (5,056 bytes), bounded here rather than sized.
SMALL_TENSOR_BYTES = 8192


def load_host_peak(
    file_bytes: int, layers: list[dict], model_type: str, read: bool = False, chunk: int = 0
) -> dict:
    """The host memory a job holds while it reads a checkpoint onto the CPU (`file_bytes`:
    its safetensors files, mapped and read whole by transformers; the tensors it keeps as
    stored are views of them). `layers`: each MoE layer's expert parameters' bytes, in
    order; `read`: whether expert_reader reads them (expert_reader.reads), else transformers
    fuses them from per-expert tensors into new tensors, layer by layer, a concatenated
    pair's two stacks alive beside the result while it is made. Read, the experts are
    allocated once transformers is done (its missing weights) and filled in place, through
    one buffer of `chunk` bytes where the stored dtype is not the model's.
    Returns the peak (with SMALL_TENSOR_BYTES), what is still held after and its parts."""
    alive = peak = file_bytes
    stacks = 0
    for params in [] if read else layers:
        for name, concat in fused_in_order(model_type):
            out = params[name]
            stacks = max(stacks, out if concat else 0)
            peak = max(peak, alive + out + (out if concat else 0))
            alive += out
    in_place = sum(sum(params.values()) for params in layers) if read else 0
    peak = max(peak, alive + in_place + (chunk if in_place else 0))
    return {
        "host_load_peak_bytes": peak + SMALL_TENSOR_BYTES,
        "host_loaded_bytes": alive + in_place,
        "checkpoint_file_bytes": file_bytes,
        "fused_experts_bytes": alive - file_bytes,
        "read_experts_bytes": in_place,
        "fusing_stacks_bytes": stacks,
    }


def file_bytes(source) -> int | None:
    """The bytes of a local checkpoint's safetensors files; None where there are none."""
    folder = Path(str(source))
    files = list(folder.glob("*.safetensors")) if folder.is_dir() else []
    return sum(f.stat().st_size for f in files) if files else None
