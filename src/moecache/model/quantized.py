"""Quantized hub experts kept as stored: the offloaded layers' routed experts in the format
their checkpoint ships them, copied to the device slots as stored bytes with their scales,
and dequantized on the device by the per-expert kernel (kernel.py), one expert at a time.

Two formats, read from the checkpoint's `quantization_config` (docs/quantized.md):

- `mxfp4` (GPT-OSS): per expert and projection, `<proj>_blocks` uint8 [out, in/32, 16] (two
  FP4 e2m1 codes a byte, the low nibble first) and `<proj>_scales` uint8 [out, in/32] (an
  e8m0 exponent, bias 127, per 32 inputs), fused over the experts as the hub stores them;
  the biases unquantized. transformers' `integrations/mxfp4.py` dequantizes them the same
  way (`convert_moe_packed_tensors`).
- `fp8` with block scales (DeepSeek-V3, the FP8 Qwen3-MoE): per expert `gate_proj`,
  `up_proj`, `down_proj`, each a float8_e4m3fn `weight` and a float32 `weight_scale_inv` per
  `weight_block_size` block; transformers' `Fp8Dequantize` (integrations/finegrained_fp8.py)
  multiplies the two in float32.

Either way a value is dequantized in float32 and cast to the model's dtype, as transformers
does when it loads the checkpoint dequantized (`dequantize=True`), so the two compute with
the same weights. The rest of the model (and any MoE layer not offloaded) is loaded as
transformers loads it, dequantized to the model's dtype.
"""

from __future__ import annotations

import copy
import functools
import math

import torch
from torch import nn

from moecache.errors import MoecacheError
from moecache.model import registry
from moecache.model.checkpoint_files import Tensors, checkpoint_folder
from moecache.model.kernel import per_expert_forward
from moecache.model.memory import DEVICE, LEDGER

# e2m1 codes 0-15: the sign is the top bit (transformers' FP4_VALUES).
FP4_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4_VALUES = FP4_MAGNITUDES + tuple(-v for v in FP4_MAGNITUDES)
E8M0_BIAS = 127
MXFP4_BLOCK = 32  # inputs per e8m0 scale
FP8_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def experts_prefix(layer: int) -> str:
    """Where the hub keeps decoder layer `layer`'s routed experts (the families above)."""
    return f"model.layers.{layer}.mlp.experts"


class Mxfp4:
    """GPT-OSS's MXFP4 experts: blocks and scales fused over the experts, as on the hub."""

    method = "mxfp4"

    def __init__(self, settings: dict, family: str):
        if family != "gpt_oss":
            raise MoecacheError(f"quantization mxfp4: moecache keeps it for gpt_oss, not {family}")

    def shapes(self, sizes) -> dict[str, tuple[tuple, torch.dtype | None]]:
        """One expert's stored tensors: name -> (shape, dtype; None: the model's dtype)."""
        h, i = sizes.hidden_size, sizes.intermediate_size
        return {
            "gate_up_proj_blocks": ((2 * i, h // MXFP4_BLOCK, MXFP4_BLOCK // 2), torch.uint8),
            "gate_up_proj_scales": ((2 * i, h // MXFP4_BLOCK), torch.uint8),
            "gate_up_proj_bias": ((2 * i,), None),
            "down_proj_blocks": ((h, i // MXFP4_BLOCK, MXFP4_BLOCK // 2), torch.uint8),
            "down_proj_scales": ((h, i // MXFP4_BLOCK), torch.uint8),
            "down_proj_bias": ((h,), None),
        }

    def dequantizing(self):
        from transformers import Mxfp4Config

        return Mxfp4Config(dequantize=True)

    def read(self, tensors: Tensors, layer: int, name: str, num_experts: int) -> torch.Tensor:
        return tensors.get(f"{experts_prefix(layer)}.{name}")

    def dequantized_peak(self, h: int, i: int, element: int) -> int:
        """What `weights` holds at its peak: gate_up [2I, H] at `element` bytes and a chunk's
        temporaries, then down [H, I] beside it and its chunk's."""
        gate_up, down = 2 * i * h * element, h * i * element
        return max(
            gate_up + MXFP4_SCRATCH * chunk_values(2 * i, h),
            gate_up + down + MXFP4_SCRATCH * chunk_values(h, i),
        )

    def weights(self, experts, e: int, dtype):
        """Expert e's (gate_up [H, 2I], its bias, down [I, H], its bias), GPT-OSS's layout."""
        return (
            mxfp4(experts.gate_up_proj_blocks[e], experts.gate_up_proj_scales[e], dtype).T,
            experts.gate_up_proj_bias[e].to(dtype),
            mxfp4(experts.down_proj_blocks[e], experts.down_proj_scales[e], dtype).T,
            experts.down_proj_bias[e].to(dtype),
        )


# Values dequantized at a time, in either format: a whole projection at once held about
# 0.25 GiB of int64 and float32 temporaries per GPT-OSS-20B expert on the device; in row
# chunks a chunk's temporaries hold at most MXFP4_SCRATCH (the int64 code 8 beside its float32
# value 4) or FP8_SCRATCH (the float32 weight and its scale) bytes a value, the same values.
# The accountant counts them and the dequantized expert; `dequantized_peak` sizes the same.
DEQUANT_CHUNK_VALUES = 2**21
DEQUANTIZED = "dequantized expert"
MXFP4_SCRATCH, FP8_SCRATCH = 12, 8


def chunked(rows: int, row_values: int, multiple: int = 1) -> range:
    """Row offsets of chunks of at most DEQUANT_CHUNK_VALUES values (at least `multiple`
    rows, and a multiple of it: FP8's scale blocks)."""
    step = max(1, DEQUANT_CHUNK_VALUES // (row_values * multiple)) * multiple
    return range(0, rows, step)


def chunk_values(rows: int, row_values: int, multiple: int = 1) -> int:
    """The values of the largest chunk `chunked` makes of a projection."""
    return min(chunked(rows, row_values, multiple).step, rows) * row_values


def counted(tensor: torch.Tensor, what: str = "dequantizing") -> torch.Tensor:
    return LEDGER.adopt(what, DEVICE, tensor)


def mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype) -> torch.Tensor:
    """[out, in] from blocks [out, in/32, 16] and e8m0 scales [out, in/32]: the FP4 value of
    each nibble (low first) times 2^(scale - 127), exact in float32, cast to `dtype`, a
    chunk of rows at a time."""
    rows, values = blocks.shape[0], blocks[0].numel() * 2
    out = counted(torch.empty((rows, values), dtype=dtype, device=blocks.device), DEQUANTIZED)
    offsets = chunked(rows, values)
    for at in offsets:
        end = at + offsets.step
        out[at:end] = mxfp4_rows(blocks[at:end], scales[at:end], dtype)
    return out


def mxfp4_rows(blocks: torch.Tensor, scales: torch.Tensor, dtype) -> torch.Tensor:
    lut = fp4_values(blocks.device)
    codes = counted(torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).to(torch.int64))
    values = counted(lut[codes].flatten(-2))  # [out, in/32, 32]
    del codes
    exponents = scales.to(torch.int32).sub_(E8M0_BIAS).unsqueeze(-1)
    return torch.ldexp(values, exponents).flatten(-2).to(dtype)


@functools.cache
def fp4_values(device: torch.device) -> torch.Tensor:
    """The e2m1 code -> value table, once per device (no host copy per expert)."""
    return torch.tensor(FP4_VALUES, dtype=torch.float32, device=device)


def fp8_families() -> list[str]:
    """The families whose hub checkpoints keep each expert's gate_proj, up_proj and
    down_proj apart (the adapters' default `hub_expert`): the layout FP8 blocks are read in."""
    from moecache.model.adapter import MoeAdapter

    default = MoeAdapter.hub_expert
    return sorted(f for f, adapter in registry.ADAPTERS.items() if adapter.hub_expert == default)


class Fp8Blocks:
    """Block-scaled FP8 experts: per expert and projection, as on the hub."""

    method = "fp8"

    def __init__(self, settings: dict, family: str):
        if family not in fp8_families():
            raise MoecacheError(
                f"quantization fp8: moecache keeps it for {', '.join(fp8_families())}, not {family}"
            )
        unsupported = {
            "activation_scheme": settings.get("activation_scheme", "dynamic") != "dynamic",
            "scale_fmt": settings.get("scale_fmt", "float") != "float",
            "expert_dtype": settings.get("expert_dtype", "fp8") != "fp8",
            "fmt": settings.get("fmt", "e4m3") != "e4m3",
            "weight_block_size": len(settings.get("weight_block_size") or ()) != 2,
        }
        for key, bad in unsupported.items():
            if bad:
                raise MoecacheError(
                    f"quantization fp8: {key} {settings.get(key)!r} is not kept as stored "
                    "(only e4m3 weights with float32 block scales, dynamic activations)"
                )
        self.block = tuple(settings["weight_block_size"])

    def shapes(self, sizes) -> dict[str, tuple[tuple, torch.dtype | None]]:
        h, i = sizes.hidden_size, sizes.intermediate_size
        out = {}
        for proj, (rows, cols) in zip(FP8_PROJECTIONS, ((i, h), (i, h), (h, i)), strict=True):
            grid = (math.ceil(rows / self.block[0]), math.ceil(cols / self.block[1]))
            out[proj] = ((rows, cols), torch.float8_e4m3fn)
            out[f"{proj}_scale_inv"] = (grid, torch.float32)
        return out

    def dequantizing(self):
        from transformers import FineGrainedFP8Config

        return FineGrainedFP8Config(dequantize=True, weight_block_size=list(self.block))

    def read(self, tensors: Tensors, layer: int, name: str, num_experts: int) -> torch.Tensor:
        proj, _, scale = name.partition("_scale")
        suffix = "weight_scale_inv" if scale else "weight"
        names = [f"{experts_prefix(layer)}.{e}.{proj}.{suffix}" for e in range(num_experts)]
        return tensors.stacked(names)

    def dequantized_peak(self, h: int, i: int, element: int) -> int:
        """What `weights` holds at its peak: gate_up [2I, H] at `element` bytes while gate and
        up are dequantized into it a chunk at a time, then down [H, I] beside it."""
        gate_up, down = 2 * i * h * element, h * i * element
        return max(
            gate_up + FP8_SCRATCH * chunk_values(i, h, self.block[0]),
            gate_up + down + FP8_SCRATCH * chunk_values(h, i, self.block[0]),
        )

    def weights(self, experts, e: int, dtype):
        """Expert e's (gate_up [2I, H], None, down [H, I], None): gate and up concatenated,
        as transformers fuses them."""
        gate, up, down = (
            (getattr(experts, p)[e], getattr(experts, f"{p}_scale_inv")[e]) for p in FP8_PROJECTIONS
        )
        rows, cols = gate[0].shape
        # gate and up dequantized into one tensor, as transformers fuses them (no second copy)
        gate_up = counted(
            torch.empty((2 * rows, cols), dtype=dtype, device=gate[0].device), DEQUANTIZED
        )
        fp8(*gate, self.block, dtype, out=gate_up[:rows])
        fp8(*up, self.block, dtype, out=gate_up[rows:])
        return gate_up, None, fp8(*down, self.block, dtype), None


def fp8(weight: torch.Tensor, scale_inv: torch.Tensor, block, dtype, out=None) -> torch.Tensor:
    """[rows, cols] float8 times its `block` (rows, cols)'s scale, in float32, cast to
    `dtype` (the blocks at the far edges may be partial, as DeepSeek's weight_dequant allows),
    a chunk of whole scale blocks of rows at a time, into `out` where given."""
    rows, cols = weight.shape
    if out is None:
        out = counted(torch.empty((rows, cols), dtype=dtype, device=weight.device), DEQUANTIZED)
    offsets = chunked(rows, cols, block[0])
    for at in offsets:
        end = min(at + offsets.step, rows)
        scale = scale_inv[at // block[0] : -(-end // block[0])].repeat_interleave(block[0], 0)
        scale = scale[: end - at, : -(-cols // block[1])].contiguous()
        scale = counted(scale.repeat_interleave(block[1], 1)[:, :cols].contiguous())
        product = counted(weight[at:end].to(torch.float32)).mul_(scale)
        del scale
        out[at:end] = product  # cast to `dtype` as it is copied
        del product  # before the next chunk's are made
    return out


FORMATS = {"mxfp4": Mxfp4, "fp8": Fp8Blocks}


def stored_format(config) -> Mxfp4 | Fp8Blocks | None:
    """The stored format of a checkpoint's routed experts, from its config's
    `quantization_config` (None: not quantized); one line for a format not kept."""
    settings = getattr(config, "quantization_config", None)
    if settings is None:
        return None
    if not isinstance(settings, dict):
        settings = settings.to_dict()
    method = str(getattr(settings.get("quant_method"), "value", settings.get("quant_method")))
    if method not in FORMATS:
        raise MoecacheError(
            f"quantization {method!r}: moecache keeps only {', '.join(FORMATS)} experts as stored"
        )
    return FORMATS[method](settings, config.model_type)


def load_kwargs(config) -> dict:
    """from_pretrained's arguments for a quantized checkpoint: transformers dequantizes what
    is not kept as stored, on any device (as it does on a CPU), to the model's dtype."""
    fmt = stored_format(config)
    return {} if fmt is None else {"quantization_config": fmt.dequantizing()}


def dequantized_bytes(config, element: int) -> int:
    """What the per-expert kernel holds on the device to compute one stored expert beside
    the stored bytes: its gate_up and down dequantized at `element` bytes (the biases are
    kept in the model's dtype) and a chunk's temporaries at most; 0 where not quantized."""
    fmt = stored_format(config)
    if fmt is None:
        return 0
    sizes = registry.adapter_for(config.model_type).sizes(config)
    return fmt.dequantized_peak(sizes.hidden_size, sizes.intermediate_size, element)


def expert_bytes(config, element: int) -> int | None:
    """Bytes of one routed expert as stored (blocks and scales; weights and scale_inv), its
    unquantized biases at `element` bytes; None for a checkpoint that is not quantized."""
    fmt = stored_format(config)
    if fmt is None:
        return None
    sizes = registry.adapter_for(config.model_type).sizes(config)
    return sum(
        math.prod(shape) * (element if dtype is None else dtype.itemsize)
        for shape, dtype in fmt.shapes(sizes).values()
    )


class StoredExperts(nn.Module):
    """A layer's routed experts as stored: its parameters are the stored tensors, [N, ...]
    over the experts (what the pool copies); the family's own experts module (kept without
    its weights) gives the layout, biases and gate (`_apply_gate`) the kernel computes with."""

    def __init__(self, own: nn.Module, fmt, tensors: dict[str, torch.Tensor]):
        super().__init__()
        gate = copy.copy(own)
        gate._parameters = {}
        object.__setattr__(self, "own", gate)  # not a submodule: it holds no weights
        self.format = fmt
        self.config, self.num_experts = own.config, own.num_experts
        self.is_transposed, self.has_bias = own.is_transposed, own.has_bias
        for name, tensor in tensors.items():
            self.register_parameter(name, nn.Parameter(tensor, requires_grad=False))

    def _apply_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.own._apply_gate(gate_up)

    def dequantized(self, e: int, dtype):
        """Expert e's (gate_up, its bias, down, its bias) in `dtype`, in the family's layout
        (the dequantized weights and their temporaries counted by the accountant)."""
        return self.format.weights(self, e, dtype)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        return per_expert_forward(self, hidden_states, top_k_index, top_k_weights)


def stored_experts(source, config, adapter, model, layers) -> dict[int, StoredExperts]:
    """Replace decoder layers `layers`' routed experts of `model` (loaded from `source`,
    whose config.json `config` is) by their stored tensors, read from the checkpoint's
    safetensors; nothing for a checkpoint that is not quantized. Returns layer ->
    StoredExperts."""
    if not layers:
        return {}
    fmt = stored_format(config)
    if fmt is None:
        return {}
    tensors = Tensors(checkpoint_folder(source))
    sizes = adapter.sizes(model.config)
    dtype = model.dtype  # what transformers dequantized the rest to
    out = {}
    for layer in layers:
        stored = {}
        for name, (shape, stored_dtype) in fmt.shapes(sizes).items():
            tensor = fmt.read(tensors, layer, name, sizes.num_experts)
            want = (sizes.num_experts, *shape)
            if tuple(tensor.shape) != want or stored_dtype not in (None, tensor.dtype):
                raise MoecacheError(
                    f"layer {layer} expert tensor {name}: {tuple(tensor.shape)} {tensor.dtype}, "
                    f"the {fmt.method} layout wants {want} {stored_dtype or dtype}"
                )
            stored[name] = tensor if stored_dtype is not None else tensor.to(dtype)
        block = adapter.block(model, layer)
        out[layer] = StoredExperts(adapter.experts(block), fmt, stored)
        adapter.set_experts(block, out[layer])
    return out
