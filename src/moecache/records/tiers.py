"""A tiered replay's results as typed records. `TiersResult` (`moecache replay --tiers
--out`): the device pool's C over a host of H experts (None: no disk), the prices of one
event, and per schedule (a device rule and its admission, or the optimum) its counts in
total, per layer and per stream, as replay/tiers.py and replay/tier_report.py count them.
`TiersGrid` (`moecache tiers-grid --out`, results/tiers/grid.json): the config's grid of
C x H x rule x admission on each trace shard, one flat row of totals per cell
(replay/tier_grid.py), read by the report's verdicts, table, figure and claim. records/io.py
writes and reads them (read_record), refusing another schema or a missing field in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from moecache.records.replay import SCHEMA, TRACED, Traced


@dataclass(frozen=True, kw_only=True)
class TiersResult(Traced):
    what: ClassVar[str] = "a tiered replay's results"
    optional: ClassVar[tuple[str, ...]] = TRACED

    schema: int = SCHEMA
    capacity: int  # C, the device's experts per layer
    host: int | None  # H, the host's experts per layer (None: every expert, no disk)
    host_rule: str | None  # the host's eviction rule (None: no disk)
    experts: int
    top_k: int
    streams: int
    tokens: int  # tokens decoded (each sequence once): ms_per_token divides by these
    prices: dict  # disk_to_host_ms, host_to_device_ms, host_compute_ms
    schedules: dict  # "<rule>/<admission>" or "optimum/<admission>" -> totals, layers, streams


GRID_ROW = ("shard", "capacity", "host", "rule", "admission", "copies", "steady", "reads")
GRID_ROW += ("computes", "ms", "ms_per_token")


@dataclass(frozen=True, kw_only=True)
class TiersGrid(Traced):
    what: ClassVar[str] = "a tiered replay's grid"
    optional: ClassVar[tuple[str, ...]] = ("settings", "device", *TRACED)

    schema: int = SCHEMA
    capacities: list  # C, device experts per layer
    hosts: list  # H, host experts per layer (None: every expert, no disk)
    host_rule: str  # the host's eviction rule
    rules: list  # the device's rules
    admissions: list  # always, bypass
    prices: dict  # disk_to_host_ms, host_to_device_ms, host_compute_ms
    shards: dict  # shard -> {"tokens", "streams", "experts", "top_k"}
    rows: list  # one per shard x C x H (C <= H) x rule x admission: GRID_ROW's fields
    settings: dict | None = None  # the config sections it read (stamped)
    device: str | None = None  # where it ran: the CPU
