"""The harness's trace format, read: one Parquet row per restricted layer, sequence and token,
with the experts the router requested, the experts used and the router's probabilities; the
file's metadata names the run that recorded it. harness/trace.py writes it; farthest-future
runs read it back as futures; trace replay and the stages read it as demand.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
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
    """A harness trace: one stream per (layer, sequence), the router's top-k as requested."""
    if not Path(path).is_file():
        raise MoecacheError(f"{path}: no such trace")
    try:
        frame = pd.read_parquet(path, columns=["sequence", "layer", "token", "requested", "probs"])
    except (ValueError, OSError, KeyError) as error:
        raise MoecacheError(f"{path}: not a harness trace ({error})") from None
    frame = frame.sort_values(["layer", "sequence", "token"])
    width = len(frame["probs"].iloc[0]) if len(frame) else 0
    if num_experts is not None and num_experts != width:
        raise MoecacheError(f"{path}: the trace has {width} experts, not --experts {num_experts}")
    streams, sequences, tokens, probs = [], [], [], []
    for (layer, seq), rows in frame.groupby(["layer", "sequence"], sort=True):
        if not np.array_equal(rows["token"].to_numpy(), np.arange(len(rows))):
            raise MoecacheError(f"{path}: layer {layer} sequence {seq} skips tokens")
        streams.append(f"layer{layer}/seq{seq}")
        sequences.append(f"seq{seq}")
        tokens.append(np.stack(rows["requested"].to_numpy()).astype(np.int64))
        probs.append(np.stack(rows["probs"].to_numpy()))
    if not streams:
        raise MoecacheError(f"{path}: the trace is empty")
    requests, lengths = padded(tokens, tokens[0].shape[1])
    table = np.zeros((*requests.shape[:2], width), dtype=np.float32)
    for s, p in enumerate(probs):
        table[s, : len(p)] = p
    demand = Demand(streams, sequences, requests, lengths, width, table, trace_origin(path))
    check(demand, str(path))
    return demand


def trace_origin(path) -> dict:
    """The run a trace's metadata names (empty for a trace written without it)."""
    recorded = pq.read_schema(path).metadata or {}
    return json.loads(recorded[ORIGIN_KEY]) if ORIGIN_KEY in recorded else {}
