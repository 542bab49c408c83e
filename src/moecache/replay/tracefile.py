"""The routing trace anyone can write (schema `moecache-trace`, version 1): one Parquet row
per layer and token of a sequence, with the experts the router sent it to.

| column     | type           | meaning                                             |
| ---------- | -------------- | --------------------------------------------------- |
| `sequence` | string         | the sequence (request) the token belongs to         |
| `layer`    | int32          | the MoE layer, 0-based                              |
| `token`    | int32          | the token's position in its sequence, 0-based       |
| `experts`  | list<int32>    | the experts routed to, in the router's order (top-k)|

The file's metadata (`moecache.trace`) holds {"schema", "version", "experts", "top_k"}, and
in a trace converted from another tool's log also "source" (the `--from` format) and
"order" ("router", or "expert-id" where the log gave each token's experts in id order, as
Megatron's does).
Rows are grouped by stream (one sequence at one layer), a stream's tokens 0, 1, ... in
order; `moecache trace convert` writes one or more whole sequences per row group, so a
reader holds one row group and one stream at a time (docs/trace-format.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from moecache.errors import MoecacheError
from moecache.records.demand import Demand, check, padded

SCHEMA_NAME, VERSION = "moecache-trace", 1
META_KEY = b"moecache.trace"
SCHEMA = pa.schema(
    [
        ("sequence", pa.string()),
        ("layer", pa.int32()),
        ("token", pa.int32()),
        ("experts", pa.list_(pa.int32())),
    ]
)


def metadata(experts: int, top_k: int, **extra) -> dict[bytes, bytes]:
    """The `moecache.trace` key; `extra` records where a converted trace came from (its
    source format and the order of each row's experts, docs/trace-format.md)."""
    info = {"schema": SCHEMA_NAME, "version": VERSION, "experts": experts, "top_k": top_k}
    return {META_KEY: json.dumps({**info, **extra}).encode()}


def header(path) -> dict | None:
    """The trace's `moecache.trace` metadata, or None for a file without it (a harness
    trace); a newer version or a foreign schema is one line."""
    if not Path(path).is_file():
        raise MoecacheError(f"{path}: no such trace")
    try:
        recorded = pq.read_schema(path).metadata or {}
    except pa.ArrowInvalid as error:
        raise MoecacheError(f"{path}: not a Parquet file ({error})") from None
    if META_KEY not in recorded:
        return None
    info = json.loads(recorded[META_KEY])
    if info.get("schema") != SCHEMA_NAME or info.get("version") != VERSION:
        raise MoecacheError(
            f"{path}: trace schema {info.get('schema')} version {info.get('version')}; "
            f"this moecache reads {SCHEMA_NAME} version {VERSION}"
        )
    return info


def rows(path) -> int:
    """Rows (layer-tokens) in the trace, from its footer."""
    return pq.ParquetFile(path).metadata.num_rows


def streams(path) -> Iterator[tuple[str, int, np.ndarray]]:
    """(sequence, layer, requests [T, k]) per stream, reading one row group at a time; a
    stream split across row groups is joined. Checks each stream's tokens run 0, 1, ..."""
    info = header(path)
    if info is None:
        raise MoecacheError(f"{path}: not a {SCHEMA_NAME} file (moecache trace convert)")
    top_k, file = info["top_k"], pq.ParquetFile(path)
    held: list[tuple] = []  # the last stream of the row group before, until it ends
    for group in range(file.num_row_groups):
        table = file.read_row_group(group, columns=["sequence", "layer", "token", "experts"])
        pieces = list(split(table, top_k, path)) if table.num_rows else []
        if held and pieces and pieces[0][:2] == held[0][:2]:
            pieces[0] = (*held[0][:2], np.concatenate([held[0][2], pieces[0][2]]))
        elif held:
            yield checked(*held[0], path)
        held = pieces[-1:]
        for piece in pieces[:-1]:
            yield checked(*piece, path)
    if held:
        yield checked(*held[0], path)


def split(table: pa.Table, top_k: int, path) -> Iterator[tuple[str, int, np.ndarray]]:
    """The row group's streams, in order, with their requests [T, k] and tokens."""
    sequence = table.column("sequence").to_numpy(zero_copy_only=False)
    layer = table.column("layer").to_numpy()
    token = table.column("token").to_numpy()
    flat = pa.chunked_array(table.column("experts")).combine_chunks()
    width = np.diff(flat.offsets.to_numpy())
    if (width != top_k).any():
        row = int(np.flatnonzero(width != top_k)[0])
        raise MoecacheError(f"{path}: row {row} routes to {width[row]} experts, not {top_k}")
    requests = flat.values.to_numpy().reshape(-1, top_k).astype(np.int64)
    cut = (sequence[1:] != sequence[:-1]) | (layer[1:] != layer[:-1])
    bounds = np.concatenate([[0], np.flatnonzero(cut) + 1, [len(layer)]])
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        yield str(sequence[a]), int(layer[a]), np.column_stack([token[a:b], requests[a:b]])


def checked(sequence: str, layer: int, rows: np.ndarray, path) -> tuple[str, int, np.ndarray]:
    if not np.array_equal(rows[:, 0], np.arange(len(rows))):
        raise MoecacheError(
            f"{path}: sequence {sequence} layer {layer}: tokens are not 0, 1, ... in order "
            "(rows must be grouped by stream)"
        )
    return sequence, layer, rows[:, 1:]


def read_demand(path) -> Demand:
    """The whole trace as one Demand (every stream in memory, for bounds and the LP)."""
    info = header(path)
    names, sequences, tokens = [], [], []
    for sequence, layer, requests in streams(path):
        names.append(f"layer{layer}/{sequence}")
        sequences.append(sequence)
        tokens.append(requests)
    if not tokens:
        raise MoecacheError(f"{path}: the trace is empty")
    if len(set(names)) < len(names):
        raise MoecacheError(f"{path}: a stream appears in two places (rows must be grouped)")
    requests, lengths = padded(tokens, info["top_k"])
    demand = Demand(names, sequences, requests, lengths, info["experts"])
    check(demand, str(path))
    return demand
