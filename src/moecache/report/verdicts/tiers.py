"""What the tiered replay's grid finds (issue 40 point 4), decided on results/tiers/grid.json
(records/tiers.py's TiersGrid): whether farthest-future's lead over LRU, in copies and in
ms, survives a disk tier and host compute; which admission costs less at the config's
prices; and the ratio of host compute to copy time below which copying stops paying.

The counts do not depend on the prices, so that ratio follows from them: with admission
`always` a rule costs copies_a c + reads_a d, with `bypass` copies_b c + reads_b d +
computes_b h (c a copy, d a disk read, h a host compute); bypass costs less exactly when
h / c < ((copies_a - copies_b) + (reads_a - reads_b) d / c) / computes_b, at the config's
d / c (no disk: the reads' term is 0). The numbers section, the table and the claim render
these fields; none parses another's text."""

from __future__ import annotations

from dataclasses import dataclass

ORACLE, BASELINE = "farthest-future", "lru"


@dataclass(frozen=True)
class Lead:
    """Farthest-future against LRU in one cell (shard, C, H, admission)."""

    shard: str
    capacity: int
    host: int | None  # None: no disk
    admission: str
    copies: tuple[int, int]  # (LRU, farthest-future)
    ms_per_token: tuple[float, float]

    @property
    def copies_saved(self) -> float:
        lru, ff = self.copies
        return 1 - ff / lru if lru else 0.0

    @property
    def ms_saved(self) -> float:
        lru, ff = self.ms_per_token
        return 1 - ff / lru if lru else 0.0


@dataclass(frozen=True)
class BreakEven:
    """One rule in one cell: the admission that costs less at the config's prices, and the
    host compute to copy time ratio below which bypass costs less than always (None: bypass
    computed nothing there)."""

    shard: str
    capacity: int
    host: int | None
    rule: str
    winner: str  # "always" or "bypass"
    ms_per_token: tuple[float, float]  # (always, bypass)
    ratio: float | None


@dataclass(frozen=True)
class TiersVerdict:
    leads: list[Lead]
    break_evens: list[BreakEven]
    ms_with_disk: bool  # farthest-future cheaper per token than LRU in every disk cell (always)
    ms_with_compute: bool  # ... in every cell with bypass
    copies_with_compute: bool  # farthest-future copies fewer than LRU in every bypass cell
    admission: str | None  # the admission that wins every cell and rule (None: it depends)
    cheapest: dict  # (shard, C, H) -> the cheapest "rule / admission" there
    price_ratio: float  # the config's host compute / copy time
    disk_ratio: float  # the config's disk read / copy time


def tiers_verdict(grid: dict) -> TiersVerdict:
    """The verdicts of a TiersGrid's fields (grid: its as_dict())."""
    prices = grid["prices"]
    copy = prices["host_to_device_ms"]
    disk_ratio = prices["disk_to_host_ms"] / copy
    cells = {cell_key(r): r for r in grid["rows"]}
    leads = [
        lead(cells, key)
        for key in cells
        if key[3] == BASELINE and (*key[:3], ORACLE, key[4]) in cells
    ]
    evens = [
        break_even(cells, key, disk_ratio)
        for key in cells
        if key[4] == "always" and (*key[:4], "bypass") in cells
    ]
    with_disk = [x for x in leads if x.host is not None and x.admission == "always"]
    with_compute = [x for x in leads if x.admission == "bypass"]
    winners = {x.winner for x in evens}
    return TiersVerdict(
        leads=leads,
        break_evens=evens,
        ms_with_disk=bool(with_disk) and all(x.ms_saved > 0 for x in with_disk),
        ms_with_compute=bool(with_compute) and all(x.ms_saved > 0 for x in with_compute),
        copies_with_compute=bool(with_compute) and all(x.copies_saved > 0 for x in with_compute),
        admission=winners.pop() if len(winners) == 1 else None,
        cheapest=cheapest(grid["rows"]),
        price_ratio=prices["host_compute_ms"] / copy,
        disk_ratio=disk_ratio,
    )


def cheapest(rows: list[dict]) -> dict:
    """Per (shard, C, H): the schedule of the least ms per token."""
    best: dict[tuple, dict] = {}
    for row in rows:
        key = (row["shard"], row["capacity"], row["host"])
        if key not in best or row["ms_per_token"] < best[key]["ms_per_token"]:
            best[key] = row
    return {key: f"{row['rule']} / {row['admission']}" for key, row in best.items()}


def cell_key(row: dict) -> tuple:
    return (row["shard"], row["capacity"], row["host"], row["rule"], row["admission"])


def lead(cells: dict, key: tuple) -> Lead:
    shard, capacity, host, _, admission = key
    lru, ff = cells[key], cells[(shard, capacity, host, ORACLE, admission)]
    return Lead(
        shard,
        capacity,
        host,
        admission,
        (lru["copies"], ff["copies"]),
        (lru["ms_per_token"], ff["ms_per_token"]),
    )


def break_even(cells: dict, key: tuple, disk_ratio: float) -> BreakEven:
    shard, capacity, host, rule, _ = key
    always, bypass = cells[key], cells[(*key[:4], "bypass")]
    saved = always["copies"] - bypass["copies"] + (always["reads"] - bypass["reads"]) * disk_ratio
    ratio = saved / bypass["computes"] if bypass["computes"] else None
    costs = (always["ms_per_token"], bypass["ms_per_token"])
    return BreakEven(
        shard,
        capacity,
        host,
        rule,
        "bypass" if costs[1] < costs[0] else "always",
        costs,
        ratio,
    )
