"""The exactness gates: their tolerances (harness/gates.py checks them, the report holds its
runs to the same numbers without importing the harness) and their results file
(results/gates/<shard>.json, `GatesResult`), which every decode job of the shard takes as
its input and the report's numbers read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from moecache.records.stamped import SCHEMA, Stamped

POOL_TOLERANCE = 5e-3  # |NLL - base NLL| of a lossless run (LRU, Dwell-1, the pool at C = N)
BATCHED_TOLERANCE = 4e-4  # |token-by-token NLL - batched NLL| of the unmodified model


@dataclass(frozen=True, kw_only=True)
class GatesResult(Stamped):
    """The unmodified model's totals, each lossless run's, the pool's throughput against
    the model's own block (absent when the reference is left out) and the failures
    (none: a failed gate writes no file)."""

    what: ClassVar[str] = "a shard's gates"
    optional: ClassVar[tuple[str, ...]] = (
        "throughput_ratio_pool_vs_own_block",
        "throughput_ratio_ci",
    )

    schema: int = SCHEMA
    base: dict  # the unmodified model's totals (nll, tokens_per_second, ...)
    batched_nll: float
    runs: dict  # run -> totals
    reference_left_out: str | None
    min_throughput_ratio: float
    gate_repeats: int
    step_seconds: dict  # run -> per-sequence seconds (median pass)
    throughput_ratio_pool_vs_own_block: float | None = None
    throughput_ratio_ci: list | None = None
    failures: list
    accountant: dict
