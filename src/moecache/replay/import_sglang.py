"""SGLang's expert-distribution recorder in `per_token` mode
(python/sglang/srt/eplb/expert_distribution.py: `_DetailSinglePassGatherer`,
`_DetailAccumulator.dump`): one `expert_distribution_recorder_{time}_{rank}.pt` per rank,
torch.save'd {"records": [one per forward pass: {"forward_pass_id", "rank",
"input_ids", "positions", "extend_seq_lens", "forward_mode", "topk_ids_of_layer":
int32 [layers, tokens, 8], ...}], "last_physical_to_logical_map": [layers, physical]}.

Read with `torch.load(weights_only=True)` (tensors, lists and plain values only; nothing
else is unpickled), torch imported only here. A pass's `topk_ids_of_layer` is -1 where
nothing was recorded: a dense layer's whole column, and the slots past the model's top-k
(the buffer holds 8), so both are dropped. The ids are physical experts (after EPLB's
placement), mapped to logical ones by the dump's last map. The passes hold no request ids,
so one sequence per rank, its tokens in pass order, as Megatron's.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from moecache.errors import MoecacheError
from moecache.replay import containers, moe_layers


def load(path) -> dict:
    """The dump, unpickling nothing but tensors and plain values; one line otherwise."""
    found = containers.kind(path)
    if found != "zip":
        looks = containers.LOOKS.get(found, found)
        raise MoecacheError(f"{path}: {looks}, not a torch .pt (a zip archive)")
    import pickle

    try:
        import torch
    except ImportError:
        raise MoecacheError(f"{path}: reading a torch .pt needs torch installed") from None
    try:
        dump = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise MoecacheError(f"{path}: not a readable torch .pt ({first[:160]})") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("records"), list):
        stat = isinstance(dump, dict) and "logical_count" in dump
        raise MoecacheError(
            f"{path}: "
            + ("an SGLang stat dump (counts only)" if stat else "not an SGLang recorder dump")
            + "; record with --expert-distribution-recorder-mode per_token"
        )
    return dump


def physical_map(path, dump: dict) -> np.ndarray | None:
    mapping = dump.get("last_physical_to_logical_map")
    return None if mapping is None else np.asarray(mapping.numpy(), dtype=np.int64)


def experts(path, dump: dict, num_experts: int | None) -> int:
    """Logical experts per layer: the map's, which --experts must agree with."""
    mapping = physical_map(path, dump)
    if mapping is None:
        if num_experts is None:
            raise MoecacheError(f"{path}: the dump has no expert map; give --experts")
        return num_experts
    found = int(mapping.max()) + 1
    if num_experts not in (None, found):
        raise MoecacheError(f"--experts {num_experts}: the dump's expert map says {found}")
    return found


def pass_ids(where: str, record) -> np.ndarray:
    if not isinstance(record, dict) or "topk_ids_of_layer" not in record:
        raise MoecacheError(f"{where}: not a per-token record (no topk_ids_of_layer)")
    ids = np.asarray(record["topk_ids_of_layer"].numpy(), dtype=np.int64)
    if ids.ndim != 3:
        raise MoecacheError(f"{where}: topk_ids_of_layer of shape {list(ids.shape)}")
    return ids


def sglang_rows(path, dump: dict, layers: list[int] | None, record: dict) -> Iterator[tuple]:
    """Blocks per forward pass and MoE layer; -1 columns (dense layers) and slots dropped."""
    record["order"] = "router"
    mapping = physical_map(path, dump)
    for number, entry in enumerate(dump["records"]):
        where = f"{path}:records[{number}]"
        ids = pass_ids(where, entry)
        if not ids.shape[1]:
            continue
        moe = layers
        if moe is None:
            moe = [layer for layer in range(ids.shape[0]) if (ids[layer] != -1).any()]
        pairs = moe_layers.columns(where, ids.shape[0], moe)
        used = np.flatnonzero((ids[[c for c, _ in pairs]] != -1).any(axis=(0, 1)))
        k = int(used[-1]) + 1 if len(used) else ids.shape[2]
        for column, layer in pairs:
            rows = ids[column, :, :k]
            moe_layers.refuse_dense(where, rows, layer, -1)
            if mapping is not None and (rows >= 0).all() and (rows < mapping.shape[1]).all():
                rows = mapping[column][rows]
            yield where, f"rank{entry.get('rank', 0)}", layer, rows, None
