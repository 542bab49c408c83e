"""The copy measurements of a device: its bandwidth (`moecache bandwidth`: results/bandwidth/
<device>.json, `BandwidthResult`), which the report, the controller's price and `moecache
plan fit` read for tau, and the link check (`moecache link-check`: results/link/<device>.json,
`LinkCheckResult`), LRU's compute and copy time under each slower link."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from moecache.records.stamped import SCHEMA, Stamped


@dataclass(frozen=True, kw_only=True)
class BandwidthResult(Stamped):
    """Time per expert copy (tau) at each multiplier, the fixed cost of a group of copies,
    and one large copy of the same bytes."""

    what: ClassVar[str] = "a bandwidth file"

    schema: int = SCHEMA
    experts: int
    layers: int
    expert_bytes: int
    tau_ms: float  # at the smallest multiplier (1x)
    group_overhead_ms: float
    multipliers: dict  # "<m>" -> tau_ms, group_overhead_ms, ratio_to_1x
    loop_gib_per_s: float
    link: str | None  # the slower link's kind (harness/link.py), None: the plain copy
    link_ring_bytes: int
    rounds: int
    large_copy_ms: float
    large_gib_per_s: float


@dataclass(frozen=True, kw_only=True)
class LinkCheckResult(Stamped):
    """LRU at 1x and at the largest multiplier under each link kind: one row per run."""

    what: ClassVar[str] = "a link check"

    schema: int = SCHEMA
    policy: str
    capacity: int
    multiplier: int  # the largest configured
    sequences: int
    timed_tokens: int
    runs: list
