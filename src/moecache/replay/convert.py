"""`moecache trace convert`: JSON lines as people log them from a serving hook, one line per
layer and token, {"sequence": id, "layer": l, "token": t, "experts": [e, ...]}, into the
versioned Parquet trace (moecache.replay.tracefile); and `trace dump`, back again.

The input may interleave the layers of a sequence (a hook logs token after token, each
through every layer) but not sequences: a sequence's lines are contiguous, and at each
layer its tokens come 0, 1, 2, ... Every line routes to the same number of distinct
experts in 0..N-1, and every layer of a sequence has as many tokens. One sequence is held
at a time; whole sequences go out in row groups of about `group_rows` rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from moecache.atomic import atomic_file
from moecache.errors import MoecacheError
from moecache.replay import tracefile
from moecache.replay.demand import json_lines

KEYS = {"sequence", "layer", "token", "experts"}


def rows(path) -> Iterator[tuple[str, dict]]:
    """(where, row) per non-blank line, with the row's keys and types checked."""
    for where, row in json_lines(path, "file"):
        if set(row) != KEYS:
            raise MoecacheError(f"{where}: need exactly the keys {', '.join(sorted(KEYS))}")
        experts = row["experts"]
        ok = isinstance(experts, list) and experts
        if not ok or any(type(v) is not int for v in [row["layer"], row["token"], *experts]):
            raise MoecacheError(
                f"{where}: layer, token and experts (a non-empty list) must be ints"
            )
        if row["layer"] < 0:
            raise MoecacheError(f"{where}: layer {row['layer']} is negative")
        yield where, row


class Sequence:
    """One sequence's rows as they arrive; checks token order per layer."""

    def __init__(self, name: str):
        self.name, self.layers = name, {}

    def add(self, where: str, row: dict) -> None:
        tokens = self.layers.setdefault(row["layer"], [])
        if row["token"] != len(tokens):
            raise MoecacheError(
                f"{where}: unsorted, sequence {self.name} layer {row['layer']} token "
                f"{row['token']} where token {len(tokens)} comes next"
            )
        tokens.append(row["experts"])

    def table(self, where: str) -> pa.Table:
        lengths = {len(tokens) for tokens in self.layers.values()}
        if len(lengths) > 1:
            raise MoecacheError(
                f"{where}: ragged, the layers of sequence {self.name} have {sorted(lengths)} tokens"
            )
        layers = sorted(self.layers)
        count = lengths.pop()
        return pa.table(
            {
                "sequence": [self.name] * (count * len(layers)),
                "layer": [layer for layer in layers for _ in range(count)],
                "token": [t for _ in layers for t in range(count)],
                "experts": [e for layer in layers for e in self.layers[layer]],
            },
            schema=tracefile.SCHEMA,
        )


def check_experts(where: str, experts: list[int], width: int, num_experts: int) -> None:
    if len(experts) != width:
        raise MoecacheError(f"{where}: ragged, routes to {len(experts)} experts, not {width}")
    if len(set(experts)) < width:
        raise MoecacheError(f"{where}: routes to an expert twice")
    bad = [e for e in experts if not 0 <= e < num_experts]
    if bad:
        raise MoecacheError(f"{where}: expert {bad[0]} outside 0..{num_experts - 1}")


def convert(source, out, num_experts: int, group_rows: int = 1 << 20) -> dict:
    """Write `source` (JSON lines) as a trace at `out`; nothing is written on an error."""
    if num_experts < 1:
        raise MoecacheError(f"--experts {num_experts}: must be at least 1")
    seen: set[str] = set()
    current, width, pending, written = None, None, [], 0
    with atomic_file(out) as tmp:
        writer = None
        try:
            for where, row in rows(source):
                width = width or len(row["experts"])
                check_experts(where, row["experts"], width, num_experts)
                name = str(row["sequence"])
                if current is None or name != current.name:
                    if name in seen:
                        raise MoecacheError(
                            f"{where}: unsorted, sequence {name} resumes after another began"
                        )
                    if current is not None:
                        pending.append(current.table(where))
                    seen.add(name)
                    current = Sequence(name)
                current.add(where, row)
                if sum(t.num_rows for t in pending) >= group_rows:
                    writer = flush(writer, pending, tmp, num_experts, width)
                    written, pending = written + sum(t.num_rows for t in pending), []
            if current is None:
                raise MoecacheError(f"{source}: no rows")
            pending.append(current.table(f"{source}: at the end"))
            writer = flush(writer, pending, tmp, num_experts, width)
            written += sum(t.num_rows for t in pending)
        finally:
            if writer is not None:
                writer.close()
    return {"rows": written, "sequences": len(seen), "experts": num_experts, "top_k": width}


def flush(writer, tables: list[pa.Table], tmp: Path, num_experts: int, width: int):
    """Write the held sequences as one row group (opening the file the first time)."""
    if writer is None:
        schema = tracefile.SCHEMA.with_metadata(tracefile.metadata(num_experts, width))
        writer = pq.ParquetWriter(tmp, schema)
    writer.write_table(pa.concat_tables(tables), row_group_size=sum(t.num_rows for t in tables))
    return writer


def dump(path) -> Iterator[str]:
    """The trace back as JSON lines, one per layer and token, stream after stream."""
    for sequence, layer, requests in tracefile.streams(path):
        for token, experts in enumerate(requests.tolist()):
            yield json.dumps(
                {"sequence": sequence, "layer": layer, "token": token, "experts": experts}
            )
