"""`moecache trace convert`: a routing log into the versioned Parquet trace
(moecache.replay.tracefile), from our JSON lines or another tool's format
(moecache.replay.importers: vLLM, SGLang, Megatron-LM, moe-policylang, NumPy arrays);
and `trace dump`, back to our JSON lines. The trace's metadata records the source format
and the order of each row's experts ("expert-id" where the log gives no router order), so
that a per-request count that depends on it can say so.

Our JSON lines hold one line per layer and token, {"sequence": id, "layer": l, "token": t,
"experts": [e, ...]}. Any format may interleave the layers of a sequence but not
sequences: a sequence's records are contiguous, and at each layer its tokens come 0, 1,
2, ... Every token routes to the same number of distinct experts in 0..N-1, and every layer
of a sequence has as many tokens. The input is read incrementally and a sequence's rows
past a bound go to disk (moecache.replay.writer), so a log larger than memory converts;
nothing is written on an error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from moecache.atomic import atomic_file
from moecache.errors import MoecacheError
from moecache.replay import importers, tracefile
from moecache.replay.writer import SPILL_ROWS, TraceWriter


def convert(
    source,
    out,
    num_experts: int | None,
    group_rows: int = 1 << 20,
    fmt: str = "moecache",
    spill_rows: int = SPILL_ROWS,
    layers: list[int] | None = None,
    prompt: bool = True,
) -> dict:
    """Write `source` (in format `fmt`) as a trace at `out`; its summary, with the order
    of the experts and, for vLLM, the prompt rows kept or left out."""
    if group_rows < 1:
        raise MoecacheError(f"--group-rows {group_rows}: must be at least 1")
    record: dict = {}
    blocks, num_experts = importers.blocks(source, fmt, num_experts, layers, prompt, record)
    with atomic_file(out) as tmp:
        writer = TraceWriter(tmp, num_experts, group_rows, spill_rows, record)
        try:
            where = None
            for where, sequence, layer, rows, token in blocks:
                if sequence != writer.name:
                    if writer.name is not None:
                        writer.end(where)
                    writer.begin(where, sequence)
                writer.add(where, layer, rows, token)
            if writer.name is not None:
                writer.end(f"{source}: at the end")
            return {**writer.close(source), **record}
        finally:
            writer.discard()


def dump(path) -> Iterator[str]:
    """The trace back as JSON lines, one per layer and token, stream after stream."""
    for sequence, layer, requests in tracefile.streams(path):
        for token, experts in enumerate(requests.tolist()):
            yield json.dumps(
                {"sequence": sequence, "layer": layer, "token": token, "experts": experts}
            )
