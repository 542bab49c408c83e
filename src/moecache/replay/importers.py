"""Routing logs as other tools write them, read incrementally into blocks for the trace
writer (moecache.replay.writer): `(where, sequence, layer, rows [n, k], token)` where
`token` is the first row's index when the format states it (None: the rows follow the
layer's earlier ones). Each format is read from the project that defines it
(docs/trace-format.md lists the fields read and where each format is defined):

- `moecache`: our JSON lines, one per layer and token,
  {"sequence", "layer", "token", "experts"}.
- `vllm`: JSON lines, one vLLM response per line, as the OpenAI-compatible server returns
  it with `--enable-return-routed-experts` ({"id", "choices": [{"index", "routed_experts":
  [tokens][layers][k]}]}), or as a script writes `RequestOutput`s of the offline API
  ({"request_id", "outputs": [{"index", "routed_experts"}]}); one sequence per choice.
- `megatron`: Megatron-LM's router trace (`--moe-routing-trace-path`,
  megatron/core/transformer/moe/router_trace.py), router_trace_rank{r}.jsonl, one record
  per step and layer {"step", "block", "layer", "rank", "num_tokens", "topk",
  "top_indices": [[e, ...], ...]}; one sequence per rank, its tokens in record order;
  decoder layers only (MTP records are skipped).
- `policylang`: moe-policylang's trace recorder (`TraceRecording.save_jsonl`), a header
  line {"model_name", "num_layers", "num_experts", "top_k", ...} then one line per layer
  and token {"p", "t", "l", "e", ...}; one sequence per prompt id `p`.
- `numpy`: a .npy array or a .npz archive of arrays [tokens, layers, k] of integer expert
  ids (layer l of the trace is column l), one sequence per array (the .npy file's stem or
  the archive's key), read a chunk of tokens at a time, never unpickled.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from moecache.errors import MoecacheError
from moecache.records.demand import json_lines

FORMATS = ("moecache", "vllm", "megatron", "policylang", "numpy")
KEYS = {"sequence", "layer", "token", "experts"}
CHUNK_TOKENS = 1 << 16  # tokens of a NumPy array read at once


def ints(where: str, value, what: str) -> np.ndarray:
    """A nested list of ints as an array; anything else is one line."""
    try:
        array = np.array(value)
    except ValueError:
        raise MoecacheError(f"{where}: {what} is ragged") from None
    if array.size and array.dtype.kind not in "iu":
        raise MoecacheError(f"{where}: {what} must hold only ints")
    return array.astype(np.int64)


def moecache_rows(path) -> Iterator[tuple]:
    for where, row in json_lines(path, "file"):
        if set(row) != KEYS:
            raise MoecacheError(f"{where}: need exactly the keys {', '.join(sorted(KEYS))}")
        experts = row["experts"]
        ok = isinstance(experts, list) and experts
        if not ok or any(type(v) is not int for v in [row["layer"], row["token"], *experts]):
            raise MoecacheError(
                f"{where}: layer, token and experts (a non-empty list) must be ints"
            )
        yield where, str(row["sequence"]), row["layer"], np.array([experts]), row["token"]


def policylang_rows(path, header: dict) -> Iterator[tuple]:
    """moe-policylang's JSON lines after its header: {"p": prompt, "t": token, "l": layer,
    "e": selected experts}."""
    lines = json_lines(path, "file")
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
        yield where, str(row.get("p", 0)), layer, np.array([experts]), token


def policylang_header(path) -> dict:
    """The recorder's first line: num_experts and top_k among its keys."""
    for where, row in json_lines(path, "file"):
        need = ("num_experts", "top_k", "num_layers")
        if any(key not in row for key in need):
            raise MoecacheError(
                f"{where}: not a moe-policylang trace header (needs {', '.join(need)})"
            )
        return row
    raise MoecacheError(f"{path}: no rows")


def vllm_rows(path) -> Iterator[tuple]:
    """One vLLM response a line; each choice's routed_experts [tokens][layers][k]."""
    for where, row in json_lines(path, "file"):
        request = row.get("id", row.get("request_id"))
        choices = row.get("choices", row.get("outputs"))
        if request is None or not isinstance(choices, list):
            raise MoecacheError(
                f"{where}: not a vLLM response (needs id and choices, or request_id and outputs)"
            )
        for choice in choices:
            routed = choice.get("routed_experts") if isinstance(choice, dict) else None
            if routed is None:
                raise MoecacheError(
                    f"{where}: a choice without routed_experts (serve with "
                    "--enable-return-routed-experts and ask for them per request)"
                )
            experts = ints(where, routed, "routed_experts")
            if experts.ndim != 3 or not experts.size:
                raise MoecacheError(
                    f"{where}: routed_experts must be [tokens][layers][k], "
                    f"not of shape {list(experts.shape)}"
                )
            name = f"{request}/{choice.get('index', 0)}"
            for layer in range(experts.shape[1]):
                yield where, name, layer, experts[:, layer], 0


def megatron_rows(path) -> Iterator[tuple]:
    """Megatron's router trace: per step and layer, top_indices [num_tokens][topk]."""
    for where, row in json_lines(path, "file"):
        missing = [k for k in ("layer", "rank", "top_indices") if k not in row]
        if missing:
            raise MoecacheError(f"{where}: not a Megatron router trace record (no {missing[0]})")
        if row.get("block", "decoder") != "decoder":
            continue  # MTP layers predict further tokens; they are not the decoder's
        indices = ints(where, row["top_indices"], "top_indices")
        if indices.ndim != 2 or len(indices) != row.get("num_tokens", len(indices)):
            raise MoecacheError(
                f"{where}: top_indices of shape {list(indices.shape)}, not "
                f"[num_tokens={row.get('num_tokens')}][topk={row.get('topk')}]"
            )
        if indices.shape[1] != row.get("topk", indices.shape[1]):
            raise MoecacheError(f"{where}: rows of {indices.shape[1]} experts, not topk")
        if type(row["layer"]) is not int:
            raise MoecacheError(f"{where}: layer must be an int")
        yield where, f"rank{row['rank']}", row["layer"], indices, None


HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def npy_chunks(where: str, stream) -> Iterator[np.ndarray]:
    """An .npy stream read `CHUNK_TOKENS` tokens at a time; only integer arrays of three
    dimensions, in C order (nothing is unpickled)."""
    try:
        version = np.lib.format.read_magic(stream)
        read_header = HEADER_READERS.get(version)
        if read_header is None:
            raise ValueError(f"format version {version}, not 1.0 or 2.0")
        shape, fortran, dtype = read_header(stream)
    except ValueError as error:
        raise MoecacheError(f"{where}: not a NumPy array ({error})") from None
    if dtype.kind not in "iu" or dtype.hasobject:
        raise MoecacheError(f"{where}: expert ids must be integers, not {dtype}")
    if len(shape) != 3 or 0 in shape:
        raise MoecacheError(f"{where}: an array of shape {list(shape)}, not [tokens, layers, k]")
    if fortran:
        raise MoecacheError(f"{where}: a Fortran-ordered array (save it in C order)")
    per_token = shape[1] * shape[2] * dtype.itemsize
    for start in range(0, shape[0], CHUNK_TOKENS):
        count = min(CHUNK_TOKENS, shape[0] - start)
        data = stream.read(count * per_token)
        if len(data) != count * per_token:
            raise MoecacheError(f"{where}: truncated at token {start + len(data) // per_token}")
        yield np.frombuffer(data, dtype=dtype).reshape(count, shape[1], shape[2])


def numpy_arrays(path) -> Iterator[tuple[str, str, object]]:
    """(where, sequence name, open stream) per array of a .npy file or a .npz archive."""
    path = Path(path)
    if not path.is_file():
        raise MoecacheError(f"{path}: no such file")
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if not member.endswith(".npy"):
                    raise MoecacheError(f"{path}:{member}: not an array of a .npz archive")
                with archive.open(member) as stream:
                    yield f"{path}:{member}", member.removesuffix(".npy"), stream
    else:
        with open(path, "rb") as stream:
            yield str(path), path.stem, stream


def numpy_rows(path) -> Iterator[tuple]:
    for where, name, stream in numpy_arrays(path):
        for chunk in npy_chunks(where, stream):
            for layer in range(chunk.shape[1]):
                yield where, name, layer, chunk[:, layer], None


def blocks(path, fmt: str, num_experts: int | None) -> tuple[Iterator[tuple], int]:
    """The blocks of `path` in format `fmt`, and the experts per layer (from the file's
    header where it has one, which --experts must then agree with)."""
    if fmt == "policylang":
        header = policylang_header(path)
        if num_experts not in (None, header["num_experts"]):
            raise MoecacheError(
                f"--experts {num_experts}: the trace's header says {header['num_experts']}"
            )
        return policylang_rows(path, header), header["num_experts"]
    if num_experts is None:
        raise MoecacheError(f"--from {fmt}: the file does not say how many experts; give --experts")
    readers = {
        "moecache": moecache_rows,
        "vllm": vllm_rows,
        "megatron": megatron_rows,
        "numpy": numpy_rows,
    }
    if fmt not in readers:
        raise MoecacheError(f"--from {fmt}: not one of {', '.join(FORMATS)}")
    return readers[fmt](path), num_experts
