"""Replay at production scale: a generated moecache-trace of `sequences` x `tokens` tokens
through `layers` layers, top-k of N experts each (bursty demand, as the speed benchmark's),
written a group of sequences at a time, then replayed under every rule by
moecache.replay.stream, one rule after another. Reports seconds per rule (the trace read
and batched included), the seconds of a read alone, and the process's peak memory (the
trace is never whole in memory). Not part of the pipeline's `all`: `make replay-scale`.
"""

from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from moecache.records.demand import subset
from moecache.replay import engine, optimum, stream, tracefile

GROUP = 8  # sequences per row group


def write_trace(path, shape: dict, seed: int) -> int:
    """Write the generated trace; returns its requests."""
    rng = np.random.default_rng(seed)
    sequences, tokens, layers = shape["sequences"], shape["tokens"], shape["layers"]
    experts, k = shape["experts"], shape["top_k"]
    schema = tracefile.SCHEMA.with_metadata(tracefile.metadata(experts, k))
    with pq.ParquetWriter(path, schema) as writer:
        for start in tqdm(range(0, sequences, GROUP), desc="write", unit="group"):
            n = min(GROUP, sequences - start)
            # [n, layers, tokens, k]: each layer its own bursty streams over the sequences
            demand = np.stack(
                [optimum.generate(rng, "bursty", n, tokens, experts, k) for _ in range(layers)],
                axis=1,
            )
            writer.write_table(group_table(demand, start, schema))
    return sequences * layers * tokens * k


def group_table(demand: np.ndarray, start: int, schema: pa.Schema) -> pa.Table:
    n, layers, tokens, k = demand.shape
    rows = n * layers * tokens
    offsets = pa.array(np.arange(0, rows * k + 1, k, dtype=np.int32))
    experts = pa.ListArray.from_arrays(offsets, pa.array(demand.reshape(-1).astype(np.int32)))
    names = np.repeat([f"seq{start + i}" for i in range(n)], layers * tokens)
    return pa.table(
        {
            "sequence": pa.array(names),
            "layer": pa.array(np.tile(np.repeat(np.arange(layers), tokens), n).astype(np.int32)),
            "token": pa.array(np.tile(np.arange(tokens), n * layers).astype(np.int32)),
            "experts": experts,
        },
        schema=schema,
    )


def replay_rule(path, rule: str, capacity: int, rows: int) -> tuple[int, float]:
    """One rule over every stream of the trace, a batch at a time: (after_fill, seconds)."""
    start, after_fill = time.perf_counter(), 0
    with tqdm(total=rows, desc=rule, unit="tok", mininterval=5) as bar:
        for demand in stream.batches(path):
            counts = engine.run(demand, engine.make_rule(rule, demand, capacity))
            after_fill += int(counts.after_fill.sum())
            bar.update(int(demand.lengths.sum()))
    return after_fill, time.perf_counter() - start


def read_seconds(path) -> float:
    start = time.perf_counter()
    for _ in stream.batches(path):
        pass
    return time.perf_counter() - start


def run(shape: dict, capacity: int, seed: int, folder=None) -> dict:
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        path = Path(tmp) / "trace.parquet"
        start = time.perf_counter()
        requests = write_trace(path, shape, seed)
        written = time.perf_counter() - start
        size = path.stat().st_size
        rows = tracefile.rows(path)
        first = next(stream.batches(path))
        rules = {}
        for rule in engine.lossless_rules(first):
            # Compiled rules load (or build) their code on first use: not timed.
            one = subset(first, [0])
            engine.run(one, engine.make_rule(rule, one, capacity))
            copies, seconds = replay_rule(path, rule, capacity, rows)
            rules[rule] = {
                "seconds": seconds,
                "requests_per_second": requests / seconds,
                "after_fill": copies,
            }
        reading = read_seconds(path)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {
        **shape,
        "capacity": capacity,
        "seed": seed,
        "requests": requests,
        "streams": shape["sequences"] * shape["layers"],
        "trace_bytes": size,
        "write_seconds": written,
        "read_seconds": reading,
        "batch_tokens": stream.BATCH_TOKENS,
        "peak_memory_bytes": peak,
        "peak_memory_gib": peak / 2**30,
        "rules": rules,
    }
