"""The tiers table (issue 40 point 4): the tiered replay's grid per shard, C, H, rule and
admission; farthest-future against LRU per cell; always against bypass with the break-even
ratio of host compute to copy time; and the verdicts (report/tiers.py renders them)."""

from __future__ import annotations

from moecache.report import tiers
from moecache.report import tiers_measured as harness_tiers
from moecache.report.tables.base import Table, not_produced

TITLE = "Beyond the paper. Tiers: a disk under the host, and misses computed on the host"


def table_tiers(tiers_grid, tiers_measured=None) -> Table:
    if not tiers_grid:
        return not_produced(
            "table_tiers",
            TITLE,
            "the config has no tiers.grid",
            ["shard", "capacity", "host", "rule", "admission", "ms_per_token"],
        )
    path = tiers_grid[0]
    grid = tiers.read(path)
    verdict = tiers.verdict_of(grid)
    parts, captions, lines = {}, {}, tiers.verdict_lines(verdict)
    sources = [path]
    if tiers_measured:
        measured = harness_tiers.read(tiers_measured[0])
        parts["measured"] = harness_tiers.frame(measured)
        captions["measured"] = harness_tiers.CAPTION
        lines = lines + harness_tiers.lines(measured)
        sources.append(tiers_measured[0])
    return Table(
        "table_tiers",
        TITLE,
        tiers.CAPTION,
        {
            "": tiers.frame(grid),
            "ff_vs_lru": tiers.leads_frame(verdict),
            "break_even": tiers.break_even_frame(verdict),
            **parts,
        },
        sources=sources,
        part_captions={
            "ff_vs_lru": tiers.LEADS_CAPTION,
            "break_even": tiers.BREAK_EVEN_CAPTION,
            **captions,
        },
        verdicts={"Verdicts:": lines},
    )
