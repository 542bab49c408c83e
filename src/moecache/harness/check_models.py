"""The models the GPU check builds, nothing downloaded: the smoke-sized OLMoE and every
other family's tiny model from seeded random inits, its token sequences, and a
paper-sized expert layer."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

# As the harness tests' smoke fixture: without it a random model's logits hardly depend on
# which experts computed the token, and the exactness gates would test nothing.
SCALE = {"gate_up_proj": 20.0, "down_proj": 50.0, "lm_head": 20.0}


class _Vocabulary:
    """What `checkpoint.embedded_config` reads of a tokenizer: its size and special ids."""

    def __init__(self, size: int):
        self.size, self.bos_token_id, self.eos_token_id, self.pad_token_id = size, 0, 1, None

    def __len__(self) -> int:
        return self.size


def smoke_model(arch: dict, vocab: int, seed: int):
    """The embedded model (an OLMoE) at `arch`'s sizes from a seeded random init, on the
    CPU, float32, its experts and output head scaled by SCALE."""
    from transformers import AutoModelForCausalLM

    from moecache.model import checkpoint, registry

    config = checkpoint.embedded_config(arch, _Vocabulary(vocab), router_aux_loss_coef=0.01)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    adapter = registry.of(model)
    with torch.no_grad():
        for layer in adapter.sizes(model.config).moe_layers:
            experts = adapter.layer_experts(model, layer)
            experts.gate_up_proj.mul_(SCALE["gate_up_proj"])
            experts.down_proj.mul_(SCALE["down_proj"])
        model.lm_head.weight.mul_(SCALE["lm_head"])
    return model


def family_model(family: str, arch: dict, vocab: int, seed: int, folder: Path) -> Path:
    """`family`'s tiny model at the smoke sizes (its experts drawn large enough to matter,
    tiny.model), its output head sharpened as the smoke model's, saved."""
    from moecache.model import tiny

    model = tiny.model(family, arch, vocab, seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(SCALE["lm_head"])
    model.save_pretrained(folder)
    return folder


def smoke_sequences(vocab: int, count: int, tokens: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (count, tokens), generator=generator).tolist()


def paper_experts(layer: dict, seed: int, implementation: str = "per-expert"):
    """The embedded family's experts module at `layer`'s sizes, on the host, seeded random
    weights (N(0, 0.02)) in `layer['dtype']`: what HostExperts and the slot kernel read."""
    from moecache.model import checkpoint, tiny

    return tiny.experts("olmoe", layer, checkpoint.DTYPES[layer["dtype"]], seed, implementation)


def float32_copy(model):
    """The same weights (already rounded to the model's dtype) computing in float32."""
    return copy.deepcopy(model).float()


def paper_checkpoint(
    config, dtype: torch.dtype, folder: Path, seed: int, stored=None, device="cpu"
) -> Path:
    """A model of `config` (a checkpoint's transformers config, its layers cut) on the
    host with seeded random weights, U(-0.025, 0.025) in `dtype`, saved to `folder` as a
    safetensors checkpoint; `stored`: "mxfp4" writes its experts as GPT-OSS's hub
    checkpoint stores them (model/tiny_quantized.py). `device` draws the weights and
    quantizes them: a CPU draws a random number a few ns apart, one after another, a
    GPU a paper-sized model's billions in milliseconds."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from moecache.model import tiny_quantized

    config = copy.deepcopy(config)
    if hasattr(config, "quantization_config"):  # written by tiny_quantized, as stored
        del config.quantization_config
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    generator = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            drawn = torch.empty(p.shape, dtype=p.dtype, device=device)
            p.copy_(drawn.uniform_(-0.025, 0.025, generator=generator))
            del drawn
    if stored is None:
        model.save_pretrained(folder)
    else:
        tiny_quantized.save(model, folder, stored, device)
    return folder
