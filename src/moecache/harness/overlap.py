"""The overlapped runs' counts in the decode results: per sequence (and layer) and in totals.

Blocking runs get none of these keys. In an overlapped row, `copy_seconds` is the time the
compute stalled on copies (the copies' share of the step), `timed_copies` counts every
insertion, prefetches included.
"""

from __future__ import annotations

from collections import Counter

SUMMED = (
    "demand_copies",
    "prefetch_copies",
    "prefetch_used",
    "prefetch_wasted",
    "stall_seconds",
    "hidden_copy_seconds",
    "block_seconds",  # the MoE blocks' own time, stalls included (the rest is outside them)
    "experts_computed",
)
GROUPS = "demand_groups"  # [[copies, experts computed before the last, tokens], ...]


def sequence_counts(pools) -> dict:
    """One sequence's counts over its layers' pools, and per layer; {} for blocking pools."""
    from moecache.harness.async_pool import AsyncExpertPool  # torch: not for the report's use

    if not pools or not isinstance(pools[0], AsyncExpertPool):
        return {}
    layers = {pool.layer: pool.counts() for pool in pools}
    summed = {key: sum(counts[key] for counts in layers.values()) for key in SUMMED}
    groups = merged_groups(counts[GROUPS] for counts in layers.values())
    return {**summed, GROUPS: groups, "layers": layers}


def merged_groups(lists) -> list:
    """Demand groups (AsyncExpertPool.count_demand) of several layers or sequences, summed."""
    total = Counter()
    for groups in lists:
        for copies, before, tokens in groups:
            total[(copies, before)] += tokens
    return [[copies, before, tokens] for (copies, before), tokens in sorted(total.items())]


def totals(rows: list[dict]) -> dict:
    """Per timed token: stall and hidden copy ms; in all: the copies and the prefetches'
    fate, with the prefetch accuracy (the share used by the tokens they were fetched for)."""
    if not rows or "prefetch_copies" not in rows[0]:
        return {}
    timed = sum(r["timed_tokens"] for r in rows)
    summed = {key: sum(r[key] for r in rows) for key in SUMMED}
    fetched = summed["prefetch_copies"]
    return {
        "stall_ms": 1e3 * summed["stall_seconds"] / timed,
        "hidden_copy_ms": 1e3 * summed["hidden_copy_seconds"] / timed,
        "demand_copies": summed["demand_copies"],
        "prefetch_copies": fetched,
        "prefetch_used": summed["prefetch_used"],
        "prefetch_wasted": summed["prefetch_wasted"],
        "prefetch_accuracy": summed["prefetch_used"] / fetched if fetched else None,
    }
