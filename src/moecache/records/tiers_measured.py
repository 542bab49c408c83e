"""The tiers measured in the harness (`moecache tiers-harness --out`, issue 40 point 3):
the prices of one event as measured apart from any decode, and per admission the
measured ms/token (with a 95% bootstrap interval over sequences and repeats), the counts
(copies, steady, reads, computes; per layer and per stream, as replay/tiers.py counts
them), the predicted ms/token of equation (1) with a term per tier
(costs/equation.py's tier_ms_per_token) at the prices the decode timed, predicted /
measured, and beside them the prediction at the prices measured apart. records/io.py writes and
reads it (read_record), refusing another schema or a missing field in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from moecache.records.stamped import SCHEMA, Stamped


@dataclass(frozen=True, kw_only=True)
class TiersMeasuredResult(Stamped):
    what: ClassVar[str] = "a tiered harness run"

    schema: int = SCHEMA
    capacity: int  # C, device slots per layer
    host: int | None  # H, host cache per layer (None: every expert in host memory, no disk)
    rule: str  # the device's eviction rule
    host_rule: str
    layers: list
    experts: int
    expert_bytes: int
    sequences: int
    tokens: int  # tokens decoded per repeat (first tokens included): ms/token divides by these
    repeats: int
    disk_read: str  # how a read avoids the page cache: O_DIRECT or posix_fadvise(DONTNEED)
    shared_processor: bool  # True on a CPU: "device" and host are the same memory and cores
    shared_processor_note: str | None
    prices: dict  # event -> {ms, ci, median_ms, events}, measured apart from the decode
    run_prices: dict  # event -> ms as the decode timed it: what the prediction uses
    equation: str  # the prediction, in words
    resident: dict  # the all-resident reference: ms_per_token, its ci, per repeat; c_ms_per_token
    admissions: dict  # always / bypass -> measured, counts, predicted, ratio, within_10pct
    gpu_check: dict  # the device side priced by a committed GPU check, or why not
