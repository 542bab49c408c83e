"""A trace replay's results (results/replay/<shard>/[c<C>/]replay.json and per-request.json,
`moecache replay --out`) as a typed record: the pool's capacity, the trace's shape and one
entry per rule (its totals and per-stream counts, as replay/engine.py counts them), with
what it traces back to (the decode run that recorded the trace, the input files by
SHA-256). Written with `schema` (SCHEMA); records/io.py reads it back."""

from __future__ import annotations

from dataclasses import dataclass, fields

SCHEMA = 1


@dataclass(frozen=True, kw_only=True)
class ReplayResult:
    schema: int = SCHEMA
    capacity: int
    experts: int
    top_k: int
    streams: int
    tokens: int
    timed_tokens: int
    rules: dict  # rule -> {"totals": {...}, "streams": [...]}
    counting: str | None = None  # "per-request" (replay/flat.py), else per token
    batch: dict | None = None  # a batched replay's geometry (replay/batch.py)
    # Provenance: the run whose trace was replayed (absent for a trace from elsewhere).
    run: str | None = None
    multiplier: int | None = None
    settings_hash: str | None = None
    device_name: str | None = None
    inputs: list | None = None
    versions: dict | None = None

    def as_dict(self) -> dict:
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if not (f.name in OPTIONAL and getattr(self, f.name) is None)
        }


OPTIONAL = (
    "counting",
    "batch",
    "run",
    "multiplier",
    "settings_hash",
    "device_name",
    "inputs",
    "versions",
)


def stamped(report: dict) -> dict:
    """A replay's report with its schema version first, as its file holds it."""
    return {"schema": SCHEMA, **report}
