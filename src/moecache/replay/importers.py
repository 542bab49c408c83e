"""Routing logs as other tools write them, read incrementally into blocks for the trace
writer (moecache.replay.writer): `(where, sequence, layer, rows [n, k], token)` where
`token` is the first row's index when the format states it (None: the rows follow the
layer's earlier ones). Each format is read from the project that defines it
(docs/trace-format.md lists the fields read, where each format is defined, and the
command that makes each engine write it):

- `moecache`: our JSON lines, one per layer and token,
  {"sequence", "layer", "token", "experts"}.
- `vllm`: vLLM's responses with routed experts (moecache.replay.import_vllm).
- `sglang`: SGLang's per-token expert-distribution dumps (moecache.replay.import_sglang).
- `megatron`: Megatron-LM's router trace (`--moe-routing-trace-path`,
  megatron/core/transformer/moe/router_trace.py), router_trace_rank{r}.jsonl, one record
  per step and layer {"step", "block", "layer", "rank", "num_tokens", "topk",
  "top_indices": [[e, ...], ...]}; one sequence per rank, its tokens in record order;
  decoder layers only (MTP records are skipped). Its rows come from `routing_map.nonzero`,
  in expert-id order, unless the record points into the logits sidecar
  (`logits_rank{r}.bin`, bfloat16), whose logits then order each token's experts.
- `policylang`: moe-policylang's trace recorder, `TraceRecording.save_jsonl` (a header
  line {"model_name", "num_layers", "num_experts", "top_k", ...} then one line per layer
  and token {"p", "t", "l", "e", "s"}) or `save_parquet` (columns prompt_id, token_idx,
  layer_idx, selected_experts, router_scores); one sequence per prompt id, each token's
  experts ordered by its router scores where they are recorded.
- `numpy`: a .npy array or a .npz archive of arrays [tokens, layers, k] of integer expert
  ids (layer l of the trace is column l), one sequence per array (the .npy file's stem or
  the archive's key), read a chunk of tokens at a time, never unpickled.

JSON lines may be plain, gzip'd or zstd'd (moecache.replay.containers); a file of another
kind is one line naming what it looks like. Where a log holds a column per decoder layer
(vllm, sglang, numpy), `--moe-layers` or `--model-config` names the MoE layers
(moecache.replay.moe_layers) and the trace keeps their real numbers. Each reader fills
`record` (the trace's metadata): the order of each token's experts, "router" or
"expert-id".
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from moecache.errors import MoecacheError
from moecache.replay import containers, import_sglang, import_vllm, moe_layers
from moecache.replay.import_vllm import ints, npy_header

FORMATS = ("moecache", "vllm", "sglang", "megatron", "policylang", "numpy")
KEYS = {"sequence", "layer", "token", "experts"}
CHUNK_TOKENS = 1 << 16  # tokens of a NumPy array read at once


def moecache_rows(path) -> Iterator[tuple]:
    for where, row in containers.json_lines(path):
        if set(row) != KEYS:
            raise MoecacheError(f"{where}: need exactly the keys {', '.join(sorted(KEYS))}")
        experts = row["experts"]
        ok = isinstance(experts, list) and experts
        if not ok or any(type(v) is not int for v in [row["layer"], row["token"], *experts]):
            raise MoecacheError(
                f"{where}: layer, token and experts (a non-empty list) must be ints"
            )
        yield where, str(row["sequence"]), row["layer"], np.array([experts]), row["token"]


def by_score(experts: list, scores) -> list:
    """The experts most probable first, where the router's scores are recorded (a stable
    sort: ties keep the recorder's order)."""
    if not isinstance(scores, list) or len(scores) != len(experts):
        return experts
    return [e for _, e in sorted(zip(scores, experts, strict=True), key=lambda p: -p[0])]


def policylang_rows(path, header: dict) -> Iterator[tuple]:
    """moe-policylang's JSON lines after its header: {"p": prompt, "t": token, "l": layer,
    "e": selected experts, "s": their router scores}."""
    lines = containers.json_lines(path)
    next(lines)  # the header, read by policylang_header
    for where, row in lines:
        missing = [key for key in ("t", "l", "e") if key not in row]
        if missing:
            raise MoecacheError(f"{where}: a policylang entry needs the keys t, l and e")
        experts, token, layer = row["e"], row["t"], row["l"]
        if not isinstance(experts, list) or not experts:
            raise MoecacheError(f"{where}: e (the selected experts) must be a non-empty list")
        if any(type(v) is not int for v in [token, layer, *experts]):
            raise MoecacheError(f"{where}: t, l and e must be ints")
        experts = by_score(experts, row.get("s"))
        yield where, str(row.get("p", 0)), layer, np.array([experts]), token


def policylang_header(path) -> dict:
    """The recorder's first line: num_experts and top_k among its keys."""
    for where, row in containers.json_lines(path):
        need = ("num_experts", "top_k", "num_layers")
        if any(key not in row for key in need):
            raise MoecacheError(
                f"{where}: not a moe-policylang trace header (needs {', '.join(need)})"
            )
        return row
    raise MoecacheError(f"{path}: no rows")


POLICYLANG_COLUMNS = ("prompt_id", "token_idx", "layer_idx", "selected_experts")


def policylang_parquet_rows(path) -> Iterator[tuple]:
    """moe-policylang's `save_parquet`: one row per layer and token, a record batch at a
    time (its columns, no header: --experts is needed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as error:
        raise MoecacheError(f"{path}: not a readable Parquet file ({error})") from None
    names = file.schema_arrow.names
    if any(name not in names for name in POLICYLANG_COLUMNS):
        raise MoecacheError(
            f"{path}: not moe-policylang's Parquet (needs {', '.join(POLICYLANG_COLUMNS)})"
        )
    columns = [*POLICYLANG_COLUMNS, *(["router_scores"] if "router_scores" in names else [])]
    start = 0
    for batch in file.iter_batches(batch_size=CHUNK_TOKENS, columns=columns):
        table = batch.to_pydict()
        for i, prompt in enumerate(table["prompt_id"]):
            where = f"{path}: row {start + i}"
            experts = table["selected_experts"][i]
            if not experts or None in experts:
                raise MoecacheError(f"{where}: selected_experts must be a non-empty list")
            scores = table["router_scores"][i] if "router_scores" in table else None
            layer, token = table["layer_idx"][i], table["token_idx"][i]
            yield where, str(prompt), layer, np.array([by_score(experts, scores)]), token
        start += batch.num_rows


def sidecar_logits(path, row: dict, cache: dict) -> np.ndarray:
    """The record's pre-top-k logits [num_tokens, num_experts] from Megatron's bfloat16
    sidecar logits_rank{r}.bin beside the trace (router_trace.py, capture_logits)."""
    file = Path(path).parent / f"logits_rank{row['rank']}.bin"
    if file not in cache:
        if not file.is_file():
            raise MoecacheError(f"{path}: records point into {file.name}, which is missing")
        cache[file] = np.memmap(file, dtype=np.uint16, mode="r")
    start, count = row["logit_offset"] // 2, row["logit_bytes"] // 2
    bits = np.asarray(cache[file][start : start + count], dtype=np.uint32) << 16
    return bits.view(np.float32).reshape(row["logit_shape"])


def megatron_order(where: str, path, row: dict, indices, record: dict, cache) -> np.ndarray:
    """Rows in router order where the record carries logits, else as recorded (expert id
    order); a file must do one or the other throughout."""
    order = "router" if "logit_offset" in row else "expert-id"
    if record.setdefault("order", order) != order:
        raise MoecacheError(f"{where}: some records carry logits (logit_offset), some not")
    if order == "expert-id" or not len(indices):
        return indices
    logits = sidecar_logits(path, row, cache)
    if logits.shape[0] != len(indices) or indices.max() >= logits.shape[1]:
        raise MoecacheError(f"{where}: logits of shape {list(logits.shape)} do not fit")
    chosen = np.take_along_axis(logits, indices, axis=1)
    return np.take_along_axis(indices, np.argsort(-chosen, axis=1, kind="stable"), axis=1)


def megatron_rows(path, record: dict) -> Iterator[tuple]:
    """Megatron's router trace: per step and layer, top_indices [num_tokens][topk]."""
    cache: dict = {}
    for where, row in containers.json_lines(path):
        missing = [k for k in ("layer", "rank", "top_indices") if k not in row]
        if missing:
            raise MoecacheError(f"{where}: not a Megatron router trace record (no {missing[0]})")
        if row.get("block", "decoder") != "decoder":
            continue  # MTP layers predict further tokens; they are not the decoder's
        if type(row["layer"]) is not int:
            raise MoecacheError(f"{where}: layer must be an int")
        indices = ints(where, row["top_indices"], "top_indices")
        count, topk = row.get("num_tokens", len(indices)), row.get("topk")
        if count == 0 and not indices.size:
            continue  # a step that routed no token on this rank
        if indices.ndim != 2 or len(indices) != count:
            raise MoecacheError(
                f"{where}: top_indices of shape {list(indices.shape)}, not "
                f"[num_tokens={count}][topk={topk}]"
            )
        if indices.shape[1] != (topk or indices.shape[1]):
            raise MoecacheError(f"{where}: rows of {indices.shape[1]} experts, not topk={topk}")
        indices = megatron_order(where, path, row, indices, record, cache)
        yield where, f"rank{row['rank']}", row["layer"], indices, None


def npy_chunks(where: str, stream) -> Iterator[np.ndarray]:
    """An .npy stream read `CHUNK_TOKENS` tokens at a time; only integer arrays of three
    dimensions, in C order (nothing is unpickled)."""
    shape, dtype = npy_header(where, stream)
    if len(shape) != 3 or 0 in shape:
        raise MoecacheError(f"{where}: an array of shape {list(shape)}, not [tokens, layers, k]")
    per_token = shape[1] * shape[2] * dtype.itemsize
    for start in range(0, shape[0], CHUNK_TOKENS):
        count = min(CHUNK_TOKENS, shape[0] - start)
        try:
            data = stream.read(count * per_token)
        except (EOFError, OSError, zipfile.BadZipFile) as error:
            raise MoecacheError(f"{where}: damaged after token {start} ({error})") from None
        if len(data) != count * per_token:
            raise MoecacheError(f"{where}: truncated at token {start + len(data) // per_token}")
        yield np.frombuffer(data, dtype=dtype).reshape(count, shape[1], shape[2])


def numpy_arrays(path) -> Iterator[tuple[str, str, object]]:
    """(where, sequence name, open stream) per array of a .npy file or a .npz archive."""
    path, found = Path(path), containers.kind(path)
    if found == "zip":
        try:
            archive = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as error:
            raise MoecacheError(f"{path}: a truncated or damaged .npz (zip: {error})") from None
        with archive:
            for member in archive.namelist():
                if not member.endswith(".npy"):
                    raise MoecacheError(f"{path}:{member}: not an array of a .npz archive")
                with archive.open(member) as stream:
                    yield f"{path}:{member}", member.removesuffix(".npy"), stream
    elif found in ("npy", "empty"):
        with open(path, "rb") as stream:
            yield str(path), path.stem, stream
    else:
        looks = containers.LOOKS.get(found, f"{found} data" if found != "text" else "text")
        raise MoecacheError(f"{path}: {looks}, not a NumPy .npy or .npz")


def numpy_rows(path, layers: list[int] | None) -> Iterator[tuple]:
    for where, name, stream in numpy_arrays(path):
        for chunk in npy_chunks(where, stream):
            for column, layer in moe_layers.columns(where, chunk.shape[1], layers):
                moe_layers.refuse_dense(where, chunk[:, column], layer, 0)
                yield where, name, layer, chunk[:, column], None


def header_experts(num_experts: int | None, said: int) -> int:
    if num_experts not in (None, said):
        raise MoecacheError(f"--experts {num_experts}: the trace's header says {said}")
    return said


def blocks(
    path,
    fmt: str,
    num_experts: int | None,
    layers: list[int] | None = None,
    prompt: bool = True,
    record: dict | None = None,
) -> tuple[Iterator[tuple], int]:
    """The blocks of `path` in format `fmt`, and the experts per layer (from the file's
    header where it has one, which --experts must then agree with). `layers` names the MoE
    layers of a log with a column per decoder layer; `prompt` keeps vLLM's prompt rows;
    `record` is filled with what the trace's metadata should say."""
    record = {} if record is None else record
    record.setdefault("source", fmt)
    if fmt not in FORMATS:
        raise MoecacheError(f"--from {fmt}: not one of {', '.join(FORMATS)}")
    if layers is not None and fmt not in ("vllm", "sglang", "numpy"):
        raise MoecacheError(f"--moe-layers: {fmt} logs name their layers themselves")
    if fmt == "sglang":
        dump = import_sglang.load(path)
        found = import_sglang.experts(path, dump, num_experts)
        return import_sglang.sglang_rows(path, dump, layers, record), found
    if fmt == "policylang" and containers.kind(path) != "parquet":
        header = policylang_header(path)
        record["order"] = "router"
        return policylang_rows(path, header), header_experts(num_experts, header["num_experts"])
    if num_experts is None:
        raise MoecacheError(f"--from {fmt}: the file does not say how many experts; give --experts")
    readers = {
        "moecache": lambda: moecache_rows(path),
        "vllm": lambda: import_vllm.vllm_rows(path, layers, prompt, record),
        "megatron": lambda: megatron_rows(path, record),
        "policylang": lambda: policylang_parquet_rows(path),
        "numpy": lambda: numpy_rows(path, layers),
    }
    if fmt not in ("megatron", "moecache"):  # Megatron's is known at its first record
        record["order"] = "router"
    return readers[fmt](), num_experts
