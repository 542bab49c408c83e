"""The harness's trace format, written and read: one Parquet row per restricted layer,
sequence and token, with the experts the router requested, the experts used and the
router's probabilities; the file's metadata names the run that recorded it. The harness
writes it (`write`); farthest-future runs read it back as futures; trace replay and the
stages read it as demand.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from moecache.errors import MoecacheError
from moecache.records.demand import Demand, check, padded

COLUMNS = [
    "sequence",
    "layer",
    "token",
    "requested",
    "used",
    "copied",  # experts copied in before the token
    "refreshed",  # a restricting policy replaced its set at the token
    "decide_seconds",  # the policy's own heads (needs_hidden), else 0
    "probs",
]
ORIGIN_KEY = b"moecache.origin"  # the Parquet metadata key naming the run that recorded it


def read_futures(trace_path, layers) -> dict:
    """Recorded demand: futures[layer][sequence] = the requested experts per token."""
    if not Path(trace_path).is_file():
        raise MoecacheError(f"{trace_path}: no trace of an earlier run (farthest-future needs one)")
    import pandas as pd  # only here: replay reads traces without it (read_demand)

    trace = pd.read_parquet(trace_path, columns=["sequence", "layer", "token", "requested"])
    futures = {}
    for layer in layers:
        rows = trace[trace["layer"] == layer].sort_values(["sequence", "token"])
        if rows.empty:
            raise MoecacheError(f"{trace_path}: no demand recorded for layer {layer}")
        futures[layer] = [
            [list(map(int, r)) for r in group["requested"]]
            for _, group in rows.groupby("sequence", sort=True)
        ]
    return futures


def read_demand(path, num_experts: int | None = None) -> Demand:
    """A harness trace: one stream per (layer, sequence), the router's top-k as requested.
    Read with pyarrow alone: pandas (which pyarrow's to_numpy imports) would add 0.2 s to
    a replay that takes less (issue 50: a replay command that starts fast)."""
    if not Path(path).is_file():
        raise MoecacheError(f"{path}: no such trace")
    try:
        table = pq.ParquetFile(path).read(columns=[*KEYS, "requested", "probs"])
        sequence, layer, token = (column(table.column(name)) for name in KEYS)
        requested, probs = (lists(table.column(name)) for name in ("requested", "probs"))
    except (ValueError, OSError, KeyError) as error:
        raise MoecacheError(f"{path}: not a harness trace ({error})") from None
    width = probs.shape[1]
    if num_experts is not None and num_experts != width:
        raise MoecacheError(f"{path}: the trace has {width} experts, not --experts {num_experts}")
    if not len(token):
        raise MoecacheError(f"{path}: the trace is empty")
    names, codes = np.unique(sequence, return_inverse=True)
    order = np.lexsort((token, codes, layer))  # by layer, sequence, token
    layer, codes, token = layer[order], codes[order], token[order]
    cut = np.flatnonzero((layer[1:] != layer[:-1]) | (codes[1:] != codes[:-1])) + 1
    streams, sequences, tokens, table_rows = [], [], [], []
    for a, b in zip([0, *cut], [*cut, len(order)], strict=True):
        seq = names[codes[a]]
        if not np.array_equal(token[a:b], np.arange(b - a)):
            raise MoecacheError(f"{path}: layer {layer[a]} sequence {seq} skips tokens")
        streams.append(f"layer{layer[a]}/seq{seq}")
        sequences.append(f"seq{seq}")
        tokens.append(requested[order[a:b]].astype(np.int64))
        table_rows.append(order[a:b])
    requests, lengths = padded(tokens, tokens[0].shape[1])
    table = np.zeros((*requests.shape[:2], width), dtype=np.float32)
    for s, at in enumerate(table_rows):
        table[s, : len(at)] = probs[at]
    demand = Demand(streams, sequences, requests, lengths, width, table, trace_origin(path))
    check(demand, str(path))
    return demand


KEYS = ("sequence", "layer", "token")


def column(values: pa.ChunkedArray) -> np.ndarray:
    """A column as NumPy: numbers straight from Arrow's buffer, anything else (sequence
    ids written as strings) through Python lists."""
    array = values.combine_chunks()
    if pa.types.is_integer(array.type) or pa.types.is_floating(array.type):
        return numbers(array)
    return np.array(array.to_pylist())


def numbers(array: pa.Array) -> np.ndarray:
    """A numeric Arrow array as NumPy, a view of its buffer (to_numpy imports pandas)."""
    if array.null_count:
        raise ValueError(f"{array.null_count} null values")
    dtype = np.dtype(array.type.to_pandas_dtype())
    if not len(array):
        return np.zeros(0, dtype)
    return np.frombuffer(array.buffers()[1], dtype, len(array), array.offset * dtype.itemsize)


def lists(values: pa.ChunkedArray) -> np.ndarray:
    """A column of equally long lists of numbers as an array [rows, length]."""
    array = values.combine_chunks()
    widths = np.diff(numbers(array.offsets))
    if len(widths) and (widths != widths[0]).any():
        raise ValueError(f"{values.type} rows of {sorted(set(widths.tolist()))} items")
    width = int(widths[0]) if len(widths) else 0
    return numbers(array.flatten()).reshape(len(array), width)


def trace_origin(path) -> dict:
    """The run a trace's metadata names (empty for a trace written without it)."""
    recorded = pq.read_schema(path).metadata or {}
    return json.loads(recorded[ORIGIN_KEY]) if ORIGIN_KEY in recorded else {}


def write(trace: list[dict], path, origin: dict) -> None:
    """Per layer and token: requested experts, experts used, router probabilities. The
    file's metadata records the run that made it (`origin`), so that what is computed from
    the trace alone can still name its config hash and device."""
    import pandas as pd  # a writer's cost only: reading a trace needs no pandas

    from moecache.atomic import atomic_file

    frame = pd.DataFrame(trace, columns=COLUMNS)
    frame["probs"] = frame["probs"].map(lambda p: p.astype("float32"))
    table = pa.Table.from_pandas(frame, preserve_index=False)
    metadata = {**table.schema.metadata, ORIGIN_KEY: json.dumps(origin).encode()}
    with atomic_file(path) as tmp:
        pq.write_table(table.replace_schema_metadata(metadata), tmp)
