"""The replay stage's results as typed records, each file JSON with `schema` (SCHEMA) first:

- `ReplayResult`: a trace replay (`moecache replay --out`: results/replay/<shard>/[c<C>/]
  replay.json and per-request.json, and the batched replays under batched/): the pool's
  capacity, the trace's shape and one entry per rule (its totals and per-stream counts, as
  replay/engine.py counts them), a batched replay's geometry;
- `BoundResult`: the bounds (`moecache bound --out`, bound.json): B_flat <= B* <= B_greedy
  in total and per stream, the LP's certificate, the mixed-precision costs;
- `ForesightResult`: limited foresight (`moecache foresight --out`, foresight.json): the
  share of the LRU-to-oracle gap recovered per foresight k and by the causal rules;
- `OptimumSweep`: greedy against the exact optimum on random instances (`moecache
  optimum-sweep --out`, results/replay/optimum-sweep.json);
- `ReplayBenchmark`: the replay's speed against libCacheSim's (`moecache benchmark-replay
  --out`, results/replay/benchmark.json).

Each keeps what it traces back to: the decode run that recorded the trace and the input
files by SHA-256 (absent for a trace from elsewhere), the package versions. records/io.py
writes and reads them, refusing another schema or a missing field in one line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from moecache.records.record import Record
from moecache.records.stamped import Stamped

SCHEMA = 1  # the replay stage's files' version: a field added, removed or changed bumps it


TRACED = ("run", "multiplier", "settings_hash", "device_name", "inputs", "versions")


@dataclass(frozen=True, kw_only=True)
class Traced(Record):
    """What a result computed from a trace traces back to, last in its file: the decode run
    that recorded the trace (records/trace.py's origin; absent for a trace from elsewhere),
    the input files by SHA-256, the package versions."""

    version: ClassVar[int] = SCHEMA

    run: str | None = None
    multiplier: int | None = None
    settings_hash: str | None = None
    device_name: str | None = None
    inputs: list | None = None
    versions: dict | None = None

    def as_dict(self) -> dict:
        found = super().as_dict()
        return {k: found[k] for k in sorted(found, key=lambda k: k in TRACED)}


@dataclass(frozen=True, kw_only=True)
class ReplayResult(Traced):
    what: ClassVar[str] = "a trace replay's results"
    optional: ClassVar[tuple[str, ...]] = ("counting", "batch", *TRACED)

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


@dataclass(frozen=True, kw_only=True)
class BoundResult(Traced):
    what: ClassVar[str] = "a trace's bounds"
    optional: ClassVar[tuple[str, ...]] = TRACED

    schema: int = SCHEMA
    capacity: int
    experts: int
    top_k: int
    orders_tried: list  # the within-token orders B_flat tried
    totals: dict  # b_flat, b_star, b_greedy, their gaps, the LP's certificate and seconds
    streams: list  # one row per (layer, sequence) stream
    mixed_precision: dict | None  # None: not asked for (--mixed-share)


@dataclass(frozen=True, kw_only=True)
class ForesightResult(Traced):
    what: ClassVar[str] = "a trace's foresight curve"
    optional: ClassVar[tuple[str, ...]] = ("batch", *TRACED)

    schema: int = SCHEMA
    capacity: int
    heldout_sequences: int
    rules: dict
    subsets: dict  # "heldout" and "all": streams, copies, foresight points, causal rules
    batch: dict | None = None  # a batched curve's geometry (replay/batch.py)


@dataclass(frozen=True, kw_only=True)
class OptimumSweep(Record):
    version: ClassVar[int] = SCHEMA
    what: ClassVar[str] = "an optimum sweep's results"

    schema: int = SCHEMA
    instances: int
    seed: int
    settings: dict  # the settings of the sweep's command (stamped)
    k_over_c: list
    greedy_not_optimal: int
    lp_dp_disagreements: int
    greedy_above_lru: int
    cells: list
    not_optimal_instances: list
    settings_hash: str
    versions: dict
    device: str
    device_name: str
    inputs: list


@dataclass(frozen=True, kw_only=True)
class ReplayBenchmark(Stamped):
    """Requests per second of each rule's replay beside libCacheSim's, and the LP's seconds
    on every stream, stamped with the settings of the benchmark (`inputs`: the trace it
    read, none for the paper-scale demand it draws)."""

    version: ClassVar[int] = SCHEMA
    what: ClassVar[str] = "a replay benchmark"

    schema: int = SCHEMA
    streams: int
    tokens: int
    requests: int
    lp: dict
    experts: int
    top_k: int
    capacity: int
    rounds: int
    rules: dict  # rule -> replay, libcachesim, speed_ratio and its interval
    inputs: list


def stamped(report: dict) -> dict:
    """A replay's report with its schema version first, as its file holds it."""
    return {"schema": SCHEMA, **report}


# The replay stage's files under results/replay/<shard>/[c<C>/], by name, and their records.
BY_NAME = {
    "replay": ReplayResult,
    "per-request": ReplayResult,
    "bound": BoundResult,
    "foresight": ForesightResult,
}
