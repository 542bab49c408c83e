"""Tiny checkpoints with quantized experts, in the hub's on-disk layout, written offline:
a tiny model (tiny.py) saved with `save_pretrained`, its safetensors then rewritten in the
stored format and its config.json given the `quantization_config` the hub ships.

- MXFP4 (GPT-OSS): transformers quantizes to MXFP4 only through the `kernels` hub's Triton
  kernels, which cannot be fetched here, so the experts are quantized by hand from the
  documented layout (quantized.py; transformers' integrations/mxfp4.py reads it back):
  per 32 inputs one e8m0 exponent, floor(log2(max |w|)) - 2 (e2m1's largest exponent), and
  each value rounded to the nearest e2m1 code, two codes a byte, the low nibble first;
  `<proj>_blocks` [E, out, in/32, 16] and `<proj>_scales` [E, out, in/32] replace the fused
  `<proj>` [E, in, out]; the biases and everything else stay as saved, as on the hub.
- FP8 with block scales (DeepSeek-V3, Qwen3-MoE FP8): every `*_proj.weight` (attention,
  dense and shared MLPs, each routed expert) quantized by transformers' own `Fp8Quantize`
  (per 128 x 128 block, float32 `weight_scale_inv`; a weight whose shape does not tile is
  left unquantized, as that op leaves it); embeddings, norms, the router and lm_head as saved.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch

from moecache.model.quantized import E8M0_BIAS, FP4_VALUES, MXFP4_BLOCK

# As published: openai/gpt-oss-20b's and deepseek-ai/DeepSeek-V3's config.json.
MXFP4_CONFIG = {
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
    "quant_method": "mxfp4",
}
FP8_CONFIG = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}


def to_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks uint8 [..., out, in/32, 16], scales uint8 [..., out, in/32]) of [..., out, in]."""
    groups = weight.float().unflatten(-1, (-1, MXFP4_BLOCK))
    amax = groups.abs().amax(dim=-1).clamp(min=2.0**-126)
    exponent = (torch.floor(torch.log2(amax)) - 2).clamp(-E8M0_BIAS, E8M0_BIAS)
    scaled = groups / torch.exp2(exponent).unsqueeze(-1)
    magnitudes = torch.tensor(FP4_VALUES[:8], device=weight.device)
    codes = (scaled.abs().unsqueeze(-1) - magnitudes).abs().argmin(dim=-1)
    codes = codes | ((scaled < 0).to(torch.int64) << 3)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.to(torch.uint8), (exponent + E8M0_BIAS).to(torch.uint8)


def mxfp4_tensors(tensors: dict) -> dict:
    """GPT-OSS's fused experts [E, in, out] replaced by their MXFP4 blocks and scales, one
    expert at a time (a paper-sized layer at once would take tens of GB of temporaries),
    each where it lies."""
    out = {}
    for name, tensor in tensors.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            quantized = [to_mxfp4(expert.transpose(-1, -2)) for expert in tensor]
            out[f"{name}_blocks"] = torch.stack([blocks for blocks, _ in quantized])
            out[f"{name}_scales"] = torch.stack([scales for _, scales in quantized])
        else:
            out[name] = tensor
    return out


def fp8_tensors(tensors: dict) -> dict:
    """Every 2-D `*_proj.weight` through transformers' Fp8Quantize (weight + scale_inv)."""
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    settings = {k: v for k, v in FP8_CONFIG.items() if k not in ("quant_method", "fmt")}
    quantize = Fp8Quantize(SimpleNamespace(quantization_config=FineGrainedFP8Config(**settings)))
    out = {}
    for name, tensor in tensors.items():
        if name.endswith("_proj.weight") and tensor.dim() == 2:
            out |= quantize.convert({name: tensor})
        else:
            out[name] = tensor
    return out


WRITERS = {"mxfp4": (mxfp4_tensors, MXFP4_CONFIG), "fp8": (fp8_tensors, FP8_CONFIG)}


def save(model, folder: str | Path, method: str, device="cpu") -> Path:
    """`model` (a tiny model) written to `folder` with its experts stored in `method`'s
    format ("mxfp4" for GPT-OSS, "fp8" for DeepSeek and Qwen), as the hub ships them;
    `device`: where the weights are quantized (a GPU quantizes a paper-sized layer in
    milliseconds, a CPU in minutes)."""
    from safetensors.torch import load_file, save_file

    folder = Path(folder)
    model.save_pretrained(folder)  # one file: transformers shards at 50 GB
    rewrite, quantization = WRITERS[method]
    weights = folder / "model.safetensors"
    stored = {k: v.cpu() for k, v in rewrite(load_file(weights, device=str(device))).items()}
    save_file(stored, weights, metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder
