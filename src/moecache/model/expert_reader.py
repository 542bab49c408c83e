"""The routed experts read from the checkpoint's files straight into the tensors the model
keeps them in: one host copy, no layer held twice while it loads.

transformers reads a checkpoint by mapping its safetensors files and fusing each MoE
layer's per-expert tensors into new ones, stacking them first (a layer's gate and up
projections are alive twice while they are joined). Here that work is skipped: the experts'
keys are renamed out of its way (`skipping`, given to from_pretrained as its `key_mapping`),
so their parameters come out allocated and unwritten (transformers' missing weights, left
uninitialised), and `read` then reads each expert's bytes into its place in the fused
tensor, where the family's conversion mapping puts it (`MergeModulelist` stacks
the experts, `Concatenate` joins gate and up along the rows). Reads go through the file's
own header and a positioned read into the destination: safetensors' reader maps the whole
file again, a second copy of the checkpoint by the host census.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from moecache.errors import MoecacheError

# safetensors' dtype names (its format's header), as torch's dtypes.
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
# A tensor stored in another dtype than the model's is read and cast this many bytes at a
# time: the one buffer reading adds to host memory (the plan counts it).
READ_CHUNK_BYTES = 2**20
UNREAD = "moecache_unread"  # what a MoE layer's expert keys are renamed to


@dataclass(frozen=True)
class Stored:
    """Where a tensor's bytes lie in a safetensors file, and what they hold."""

    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int

    def rows(self, e: int) -> tuple[int, tuple[int, ...]]:
        """Byte offset and shape of row `e` (an expert of a tensor fused over the experts)."""
        row = self.shape[1:]
        return self.start + e * torch.Size(row).numel() * self.dtype.itemsize, row


def index(folder: Path) -> dict[str, Stored]:
    """Every tensor of a checkpoint folder's safetensors files, by its header (8 bytes of
    little-endian length, then JSON: dtype, shape and data offsets per tensor)."""
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        for key, entry in header.items():
            if key != "__metadata__":
                begin = 8 + size + entry["data_offsets"][0]
                tensors[key] = Stored(file, DTYPES[entry["dtype"]], tuple(entry["shape"]), begin)
    return tensors


def layer_keys(layer: int) -> str:
    """A pattern for decoder layer `layer`'s routed-expert keys, under whatever name the
    checkpoint gives its sparse block (Mixtral's `block_sparse_moe`, the others' `mlp`); a
    shared expert's keys (`mlp.shared_experts.`) do not match."""
    return rf"\blayers\.{layer}\.[^.]+\.experts\."


def reads(config) -> bool:
    """Whether the checkpoint's routed experts are read here: per-expert tensors that
    transformers would fuse (a family stored fused, GPT-OSS, is read as views of its mapped
    files, nothing made; a quantized checkpoint's are kept as stored, model/quantized.py)."""
    from moecache.model import quantized

    return quantized.stored_format(config) is None and bool(converters(config.model_type))


def skipping(layers) -> dict[str, str]:
    """from_pretrained's `key_mapping` that keeps transformers from reading `layers`' experts."""
    return {layer_keys(layer): f"layers.{layer}.{UNREAD}." for layer in layers}


def converters(model_type: str) -> dict[str, tuple[str, int]]:
    """Per-expert source name (after `experts.<e>.`) -> (fused parameter, its place among
    the sources joined into it), from transformers' conversion mapping of the family."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightConverter

    out = {}
    for entry in get_checkpoint_conversion_mapping(model_type) or []:
        if not isinstance(entry, WeightConverter):
            continue
        target = entry.target_patterns[0].rsplit(".", 1)[-1]
        for k, source in enumerate(entry.source_patterns):
            if "experts.*." in source:
                out[source.split("experts.*.", 1)[1]] = (target, k)
    return out


def destinations(keys: dict[str, Stored], params: dict, model_type: str, num_experts: int):
    """(stored tensor, the expert row it is read from or None, parameter, destination) for
    every routed-expert tensor of a layer; `keys`: the layer's keys after `experts.`."""
    sources = converters(model_type)
    for suffix, stored in keys.items():
        if suffix in params:  # fused over the experts as stored (GPT-OSS)
            yield from ((stored, e, suffix, params[suffix][e]) for e in range(num_experts))
            continue
        e, _, name = suffix.partition(".")
        if not e.isdigit() or name not in sources:
            raise MoecacheError(f"checkpoint expert tensor {suffix!r}: no parameter takes it")
        target, place = sources[name]
        earlier = [n for n, (t, k) in sources.items() if t == target and k < place]
        offset = sum(keys[f"{e}.{n}"].shape[0] for n in earlier)
        yield stored, None, target, params[target][int(e)].narrow(0, offset, stored.shape[0])


def read_into(stored: Stored, row: int | None, out: torch.Tensor) -> None:
    """`stored` (or its row `row`) read into `out`: straight into its bytes where the dtypes
    agree, else a chunk at a time, cast."""
    start, shape = stored.rows(row) if row is not None else (stored.start, stored.shape)
    if tuple(shape) != tuple(out.shape):
        raise MoecacheError(f"{stored.file.name}: expert tensor {shape}, the model's {out.shape}")
    flat = out.view(-1)
    with open(stored.file, "rb", buffering=0) as f:
        if stored.dtype == out.dtype:
            fill(f, start, flat.view(torch.uint8).numpy())
            return
        step = READ_CHUNK_BYTES // stored.dtype.itemsize
        chunk = torch.empty(step, dtype=stored.dtype)
        for at in range(0, flat.numel(), step):
            n = min(step, flat.numel() - at)
            fill(f, start + at * stored.dtype.itemsize, chunk[:n].view(torch.uint8).numpy())
            flat[at : at + n].copy_(chunk[:n])


def fill(f, at: int, buffer) -> None:
    """`buffer`'s bytes from file `f` at byte `at` (a read may return fewer than asked)."""
    view, got = memoryview(buffer).cast("B"), 0
    f.seek(at)
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise MoecacheError(f"{f.name}: ends before its header says")
        got += n


def saves_as_read(model) -> None:
    """The model's `save_pretrained` writing the checkpoint's names again: transformers
    keeps, for saving, the conversions its load used, and ours left the experts' out (and
    put the renaming that skipped them in). Kept now: those it used but ours, and the
    family's expert converters, in the mapping's own order."""
    from transformers.conversion_mapping import get_model_conversion_mapping

    def key(c):
        return type(c), tuple(c.source_patterns), tuple(c.target_patterns)

    def fuses_experts(c) -> bool:
        return any("experts.*." in pattern for pattern in c.source_patterns)

    used = {key(c) for c in getattr(model, "_weight_conversions", None) or []}
    mapping = get_model_conversion_mapping(model)
    model._weight_conversions = [c for c in mapping if key(c) in used or fuses_experts(c)]


def read(model, adapter, folder: Path, layers) -> None:
    """`layers`' routed experts of `model` (left unwritten by transformers) read from the
    checkpoint in `folder`, each expert into its place."""
    tensors = index(folder)
    num_experts = adapter.sizes(model.config).num_experts
    with torch.no_grad():
        for layer in layers:
            pattern = re.compile(layer_keys(layer))
            keys = {
                key[m.end() :]: stored
                for key, stored in tensors.items()
                if (m := pattern.search(key))
            }
            params = dict(adapter.layer_experts(model, layer).named_parameters(recurse=False))
            written = dict.fromkeys(params, 0)
            family = model.config.model_type
            for stored, row, name, out in destinations(keys, params, family, num_experts):
                read_into(stored, row, out)
                written[name] += out.numel()
            short = [name for name, p in params.items() if written[name] != p.numel()]
            if short:
                raise MoecacheError(
                    f"checkpoint {folder}: layer {layer}'s experts lack {', '.join(short)}"
                )
