"""Writing a moecache-trace from routing that arrives in any order within a sequence, in
bounded memory: what every importer (moecache.replay.importers) hands to, one block of
tokens of one layer at a time.

A sequence's blocks may interleave its layers (a hook logs token after token, each through
every layer; Megatron logs a step of every layer at once) but sequences may not interleave.
Each block is checked as it arrives (width, ids in 0..N-1, no repeat within a token, tokens
in order); rows held past `spill_rows` go to one temporary file per layer, so a sequence
longer than memory (a Megatron rank's whole run) converts; at the sequence's end its layers
are written stream after stream, in row groups of about `group_rows` rows.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from moecache.errors import MoecacheError
from moecache.replay import tracefile

SPILL_ROWS = 1 << 22  # rows (layer-tokens) held in memory before they go to disk


def check_rows(where: str, rows: np.ndarray, width: int, num_experts: int, first: int) -> None:
    """Width, range and distinctness of a block of rows; the message names the first bad
    token (by its index in the sequence) when the block holds several."""

    def at(i: int) -> str:
        return where if len(rows) == 1 else f"{where} (token {first + i})"

    if rows.shape[1] != width:
        raise MoecacheError(f"{at(0)}: ragged, routes to {rows.shape[1]} experts, not {width}")
    outside = (rows < 0) | (rows >= num_experts)
    if outside.any():
        i, j = np.argwhere(outside)[0]
        raise MoecacheError(f"{at(i)}: expert {rows[i, j]} outside 0..{num_experts - 1}")
    ordered = np.sort(rows, axis=1)
    twice = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
    if twice.any():
        raise MoecacheError(f"{at(int(np.flatnonzero(twice)[0]))}: routes to an expert twice")


class TraceWriter:
    """Blocks in (begin, add, end per sequence), a moecache-trace out at `path`. `record`:
    what an importer of another tool's log recorded (its `source` and the experts' `order`),
    kept in the file's metadata; read at the first row group, by when the importer has read
    its first records (our own JSON lines record nothing there)."""

    def __init__(
        self,
        path: Path,
        num_experts: int,
        group_rows: int,
        spill_rows: int = SPILL_ROWS,
        record: dict | None = None,
    ):
        if num_experts < 1:
            raise MoecacheError(f"--experts {num_experts}: must be at least 1")
        self.path, self.num_experts, self.group_rows = path, num_experts, group_rows
        self.spill_rows, self.width, self.writer = spill_rows, None, None
        self.folder = tempfile.TemporaryDirectory(dir=Path(path).parent)
        self.seen: set[str] = set()
        self.name, self.pending, self.pending_rows, self.rows = None, [], 0, 0
        self.record = {} if record is None else record

    def begin(self, where: str, name: str) -> None:
        if name in self.seen:
            raise MoecacheError(f"{where}: unsorted, sequence {name} resumes after another began")
        self.seen.add(name)
        self.name, self.held, self.held_rows = name, {}, 0
        self.counts: dict[int, int] = {}
        self.spilled: dict[int, Path] = {}

    def add(self, where: str, layer: int, rows: np.ndarray, token: int | None = None) -> None:
        """Rows [n, k] of `layer`, its next tokens; `token`, when the format states it, is the
        first one's index, which must be the one that comes next."""
        if layer < 0:
            raise MoecacheError(f"{where}: layer {layer} is negative")
        done = self.counts.get(layer, 0)
        self.width = self.width or rows.shape[1]
        check_rows(where, rows, self.width, self.num_experts, done)
        if token is not None and token != done:
            raise MoecacheError(
                f"{where}: unsorted, sequence {self.name} layer {layer} token {token} "
                f"where token {done} comes next"
            )
        self.held.setdefault(layer, []).append(rows.astype(np.int32, copy=False))
        self.counts[layer] = done + len(rows)
        self.held_rows += len(rows)
        if self.held_rows >= self.spill_rows:
            self.spill()

    def spill(self) -> None:
        """Append each layer's held rows to its file."""
        for layer, blocks in self.held.items():
            path = self.spilled.setdefault(layer, Path(self.folder.name) / f"layer{layer}.i32")
            with open(path, "ab") as out:
                for block in blocks:
                    np.ascontiguousarray(block).tofile(out)
        self.held, self.held_rows = {}, 0

    def end(self, where: str) -> None:
        """The sequence is complete: check its layers agree and write them."""
        lengths = set(self.counts.values())
        if len(lengths) > 1:
            raise MoecacheError(
                f"{where}: ragged, the layers of sequence {self.name} have {sorted(lengths)} tokens"
            )
        for layer in sorted(self.counts):
            start = 0
            for block in self.blocks(layer):
                self.pending.append(self.table(layer, start, block))
                self.pending_rows += len(block)
                start += len(block)
                if self.pending_rows >= 4 * self.group_rows:  # a sequence too long to hold
                    self.flush()
        if self.pending_rows >= self.group_rows:
            self.flush()
        self.held, self.counts, self.spilled = {}, {}, {}

    def blocks(self, layer: int):
        """The layer's rows in order: from its spill file a group at a time, then held ones."""
        if layer in self.spilled:
            rows = np.memmap(self.spilled[layer], dtype=np.int32, mode="r").reshape(-1, self.width)
            for start in range(0, len(rows), self.group_rows):
                yield np.array(rows[start : start + self.group_rows])
            del rows
            self.spilled[layer].unlink()
        yield from self.held.get(layer, [])

    def table(self, layer: int, start: int, rows: np.ndarray) -> pa.Table:
        n, k = rows.shape
        experts = pa.ListArray.from_arrays(
            pa.array(np.arange(0, (n + 1) * k, k, dtype=np.int32)), pa.array(rows.reshape(-1))
        )
        return pa.table(
            {
                "sequence": pa.array([self.name] * n, pa.string()),
                "layer": pa.array(np.full(n, layer, dtype=np.int32)),
                "token": pa.array(np.arange(start, start + n, dtype=np.int32)),
                "experts": experts,
            },
            schema=tracefile.SCHEMA,
        )

    def flush(self) -> None:
        if not self.pending:
            return
        if self.writer is None:
            imported = self.record.get("source", "moecache") != "moecache"
            said = {k: v for k, v in self.record.items() if imported and k in ("source", "order")}
            metadata = tracefile.metadata(self.num_experts, self.width, **said)
            self.writer = pq.ParquetWriter(self.path, tracefile.SCHEMA.with_metadata(metadata))
        self.writer.write_table(pa.concat_tables(self.pending), row_group_size=self.pending_rows)
        self.rows += self.pending_rows
        self.pending, self.pending_rows = [], 0

    def close(self, source) -> dict:
        """Write what is left; the summary of the trace."""
        if not self.seen:
            raise MoecacheError(f"{source}: no rows")
        self.flush()
        self.writer.close()
        self.writer = None
        return {
            "rows": self.rows,
            "sequences": len(self.seen),
            "experts": self.num_experts,
            "top_k": self.width,
        }

    def discard(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.folder.cleanup()
