"""A decode run's results (results/runs/<shard>/<label>.json) as a typed record.

`RunResult` is one run at one copy multiplier on one shard: blocking or overlapped
(`overlap`), restricting the experts a token may use or not (`restricts`), the sequences it
decoded (`sequences_decoded`), its totals and one `SequenceRow` per sequence. Seconds are
kept apart: `stall_seconds` is the time the compute waited on copies and
`hidden_copy_seconds` (overlapped rows only) the copy time spent under compute, so a copy's
own time is their sum (`copy_busy_seconds`). `copy_seconds`, kept under its old name for
the readers of older code, is the step's share spent waiting on copies: the copy time of a
blocking run (whose compute waits for every copy), the stall time of an overlapped one.

The file is JSON with `schema` (SCHEMA): records/io.py reads and writes it, refusing an
unknown version or a missing field in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from moecache.records.record import Record

SCHEMA = 1  # the results file's version: a field added, removed or changed in meaning bumps it

# An overlapped row's counts (harness/overlap.py): absent from a blocking row.
OVERLAP_COUNTS = (
    "demand_copies",
    "prefetch_copies",
    "prefetch_used",
    "prefetch_wasted",
    "hidden_copy_seconds",
    "block_seconds",
    "experts_computed",
    "demand_groups",
    "layers",
)


@dataclass(frozen=True, kw_only=True)
class SequenceRow:
    """One decoded sequence of a run: counts from the first pass, timings the median pass."""

    sequence: int  # its index among the shard's held-out sequences
    tokens: int
    nll_sum: float
    scored: int
    timed_tokens: int  # every token but the first (it fills the empty pool)
    step_seconds: float
    copy_seconds: float  # the step's time waiting on copies (= stall_seconds, median pass)
    stall_seconds: float  # the compute's wait on copies (a blocking run: all its copy time)
    timed_copies: int
    copy_groups: int
    fills: int
    steady: int
    step_repeats: list
    copy_repeats: list
    nll: float
    # Overlapped rows only (None in a blocking row, and left out of its file).
    demand_copies: int | None = None
    prefetch_copies: int | None = None
    prefetch_used: int | None = None
    prefetch_wasted: int | None = None
    hidden_copy_seconds: float | None = None
    block_seconds: float | None = None
    experts_computed: int | None = None
    demand_groups: list | None = None
    layers: dict | None = None

    @property
    def copy_busy_seconds(self) -> float:
        """The copies' own time: stalled or hidden under compute."""
        return self.stall_seconds + (self.hidden_copy_seconds or 0.0)

    @classmethod
    def decoded(cls, row: dict) -> SequenceRow:
        """A row as harness/decode.py finished it: a blocking row's stall is its copy time."""
        names = {f.name for f in fields(cls)}
        kept = {key: value for key, value in row.items() if key in names}
        kept.setdefault("stall_seconds", row["copy_seconds"])
        return cls(**kept)

    def as_dict(self) -> dict:
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if not (f.name in OVERLAP_COUNTS and getattr(self, f.name) is None)
        }


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """A decode run's results file: what the run was, what it measured, what it came from."""

    schema: int = SCHEMA
    run: str  # its name in harness.runs
    policy: str
    params: dict
    overlap: bool  # overlapped (copies beside compute) or blocking
    restricts: bool  # its policy restricts the experts a token may use (lossy)
    prefetch: str | None  # an overlapped run's prefetcher (None: blocking)
    prefetch_params: dict
    capacity: int
    multiplier: int
    shard: str
    restricted_layers: list
    base_nll: float  # the unmodified model's NLL on the sequences this run decoded
    gates: str
    trace_in: str | None  # the label whose demand it read (farthest-future)
    interleaved_with: list
    twin_1x: dict | None  # a scaled run's 1x twin: totals and per-sequence timing
    device_memory: dict
    accountant: dict
    sequences_decoded: list  # the held-out sequences' indices, in the order decoded
    totals: dict
    sequences: tuple[SequenceRow, ...]
    fan_out: str | None = None  # `run`: decoded beside its reference alone
    reference: dict | None = None  # fan_out `run`: the all-resident run beside it
    # Provenance (moecache/provenance.py's stamp).
    settings: dict
    settings_hash: str
    versions: dict
    device: str
    device_name: str
    # A controller run's refreshes and heads' share, added from its trace after the run
    # (controller/evaluate.py annotate); absent from every other run's file.
    controller: dict | None = None

    @property
    def overlapped(self) -> bool:
        return self.overlap

    @property
    def blocking(self) -> bool:
        return not self.overlap

    @property
    def label(self) -> str:
        return f"{self.run}-x{self.multiplier}"

    def stall_seconds(self) -> float:
        """The compute's waits on copies over every sequence."""
        return sum(row.stall_seconds for row in self.sequences)

    def copy_busy_seconds(self) -> float:
        """The copies' own time over every sequence, stalled or hidden."""
        return sum(row.copy_busy_seconds for row in self.sequences)

    def as_dict(self) -> dict:
        """The file's fields, in the file's order (a fan_out `shard` run has no fan_out, a
        run the controller's sweep did not annotate no controller)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("fan_out", "reference") and self.fan_out is None:
                continue
            if f.name == "controller" and value is None:
                continue
            out[f.name] = [row.as_dict() for row in value] if f.name == "sequences" else value
        return out


# Fields a file may lack: written only by some runs.
OPTIONAL = ("fan_out", "reference", "controller")


BATCHED_SCHEMA = 1  # a batched run's results file's version


@dataclass(frozen=True, kw_only=True)
class BatchedRunResult(Record):
    """A run decoded B sequences at once (`moecache decode-batched`: results/batched/<shard>/
    <shape>/<run>.json, harness/batched_runs.py): its totals (ms per step and per
    sequence-token with their intervals, Delta NLL against the batch-one NLL), one row per
    sequence and one per batch."""

    version: ClassVar[int] = BATCHED_SCHEMA
    what: ClassVar[str] = "a batched run's results"
    optional: ClassVar[tuple[str, ...]] = ("fan_out", "reference")

    schema: int = BATCHED_SCHEMA
    run: str
    policy: str
    params: dict
    capacity: int
    shard: str
    shape: str  # the batch shape (runs.BatchShape): b<B>-<batching>-p<prefill>
    lossless: bool
    interleaved_with: list
    totals: dict
    sequences: list
    batches: list
    fan_out: str | None = None  # `run`: decoded beside its reference alone
    reference: dict | None = None  # fan_out `run`: the reference's name and totals
    # Provenance (moecache/provenance.py's stamp).
    settings: dict
    settings_hash: str
    versions: dict
    device: str
    device_name: str
