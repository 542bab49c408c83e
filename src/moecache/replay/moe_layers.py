"""Which decoder layers of a model are MoE layers, for logs that hold a column for every
decoder layer: vLLM's routed-experts capturer sizes its buffer by `num_hidden_layers` and
leaves a dense layer's rows all zero (DeepSeek's first layers, Qwen's `mlp_only_layers`),
and SGLang's per-token recorder leaves them -1. Named by `--moe-layers 1-26,28` or read
from a checkpoint's config.json with plain json (the rules of the family adapters'
`moe_layers`, src/moecache/model/, without importing torch).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from moecache.errors import MoecacheError


def parse(text: str) -> list[int]:
    """ "1-3,5" as [1, 2, 3, 5]: sorted, distinct, non-negative."""
    layers: set[int] = set()
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            layers.update(range(int(first), int(last or first) + 1))
    except ValueError:
        raise MoecacheError(f"--moe-layers {text}: not a list like 1-26,28") from None
    if not layers or min(layers) < 0:
        raise MoecacheError(f"--moe-layers {text}: needs layer numbers 0 or more")
    return sorted(layers)


def from_config(path) -> list[int]:
    """The MoE layers of a checkpoint's config.json (or the folder holding it), as its
    family's adapter decides them: DeepSeek's `first_k_dense_replace` (and
    `moe_layer_freq`), Qwen's `decoder_sparse_step` and `mlp_only_layers`, Nemotron's
    `layers_block_type`; every layer otherwise (Mixtral, OLMoE, gpt-oss)."""
    path = Path(path)
    path = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise MoecacheError(f"{path}: not a readable config.json ({error})") from None
    config = config.get("text_config", config)
    if "layers_block_type" in config:
        return [i for i, kind in enumerate(config["layers_block_type"]) if kind == "moe"]
    if type(config.get("num_hidden_layers")) is not int:
        raise MoecacheError(f"{path}: no num_hidden_layers")
    n, dense = config["num_hidden_layers"], set(config.get("mlp_only_layers") or [])
    if config.get("first_k_dense_replace") is not None:
        first, every = config["first_k_dense_replace"], config.get("moe_layer_freq") or 1
        return [i for i in range(first, n) if i % every == 0 and i not in dense]
    step = config.get("decoder_sparse_step") or 1
    return [i for i in range(n) if (i + 1) % step == 0 and i not in dense]


def columns(where: str, width: int, layers: list[int] | None) -> list[tuple[int, int]]:
    """(column, layer) pairs of an array with `width` layer columns: every column when no
    MoE layers are named; with them, the named columns of a full-width array (dense ones
    skipped), or the columns in order of one holding the MoE layers only."""
    if layers is None:
        return [(c, c) for c in range(width)]
    if width == len(layers):
        return list(enumerate(layers))
    if layers[-1] < width:
        return [(layer, layer) for layer in layers]
    raise MoecacheError(
        f"{where}: {width} layer columns, neither every decoder layer (MoE layers up to "
        f"{layers[-1]}) nor the {len(layers)} MoE layers named"
    )


def refuse_dense(where: str, rows: np.ndarray, layer: int, blank: int) -> None:
    """A column where every token routes k > 1 times to `blank` (vLLM's 0, SGLang's -1) is
    a dense layer's, not routing: one line saying how to name the MoE layers."""
    if rows.shape[1] > 1 and len(rows) and (rows == blank).all():
        raise MoecacheError(
            f"{where}: layer {layer} is all {blank} (a dense layer?); name the MoE layers "
            "with --moe-layers or --model-config CONFIG.json"
        )
