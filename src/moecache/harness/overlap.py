"""The overlapped runs' counts in the decode results: per sequence (and layer) and in totals.

The demand groups' key and their sum are the overlap cost model's (costs/overlap.py).
Blocking runs get none of these keys. In an overlapped row, `copy_seconds` is the time the
compute stalled on copies (the copies' share of the step), `timed_copies` counts every
insertion, prefetches included.
"""

from __future__ import annotations

from moecache.costs.overlap import GROUPS, merged_groups

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


def sequence_counts(pools) -> dict:
    """One sequence's counts over its layers' pools, and per layer; {} for blocking pools."""
    from moecache.harness.async_pool import AsyncExpertPool  # torch: not for the report's use

    if not pools or not isinstance(pools[0], AsyncExpertPool):
        return {}
    layers = {pool.layer: pool.counts() for pool in pools}
    summed = {key: sum(counts[key] for counts in layers.values()) for key in SUMMED}
    groups = merged_groups(counts[GROUPS] for counts in layers.values())
    return {**summed, GROUPS: groups, "layers": layers}


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
