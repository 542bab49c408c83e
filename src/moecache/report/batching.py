"""Batched decoding's answer, as data: copies per sequence-token against the batch size B
from the batched replay (every rule, the whole shard), and ms per sequence-token, copies and
Delta NLL from the harness's batched runs (docs/batching.md).

`rows` reads both into one list of plain rows; `verdicts` derives what the README states
from them: the smallest B at which farthest-future saves less than 10% of LRU's copies
(per batching mode, without prefill), and how a restricting run's Delta NLL moves with B.
"""

from __future__ import annotations

from pathlib import Path

from moecache.policies import ZOO
from moecache.records.io import read_dict, read_replay_dict
from moecache.records.run import BatchedRunResult
from moecache.runs import BatchShape

ORACLE, BASELINE = "farthest-future", "lru"
# Rules the figure names on their own; the best of the caching zoo (policies.ZOO) is
# "the best zoo rule".
NAMED = (BASELINE, ORACLE, "decayed-frequency")
MODES_SHOWN = ("static", "continuous")
# The figure's colours, in this order.
SHOWN = (BASELINE, ORACLE, "decayed-frequency", "lfu", "dwell-16", "best zoo", "other")
SMALL_SAVING = 0.10  # farthest-future "stops mattering" below this share of LRU's copies


def shape_of(path) -> BatchShape:
    """results/replay/a/batched/b4-static-p0.json or results/batched/a/b4-static-p0/lru.json."""
    path = Path(path)
    return BatchShape.parse(path.stem if path.parent.name == "batched" else path.parent.name)


def replay_rows(paths) -> list[dict]:
    """One row per replayed file and rule: copies per sequence-token (steady copies) and
    the share of the LRU-to-farthest-future gap."""
    rows = []
    for path in paths:
        report, shape = read_replay_dict(path), shape_of(path)
        for rule, result in report["rules"].items():
            totals = result["totals"]
            rows.append(
                {
                    "source": "replay",
                    "shape": shape,
                    "rule": rule,
                    "capacity": report["capacity"],
                    "copies_per_token": totals["copies_per_token"],
                    "gap_recovered": totals["gap_recovered"],
                    "prefill_copies": totals.get("prefill_copies"),
                    # B = 1, static, no prefill: the plain replay (its union is a token's).
                    "widest_union": report.get("batch", {}).get("widest_union", report["top_k"]),
                }
            )
    return rows


def harness_rows(paths) -> list[dict]:
    """One row per batched run: steady copies and ms per sequence-token (95% interval),
    Delta NLL, and a prefill's copies and milliseconds per sequence."""
    rows = []
    for path in paths:
        report = read_dict(path, BatchedRunResult)
        totals, sequences = report["totals"], len(report["sequences"])
        prefill = "prefill_seconds" in totals
        rows.append(
            {
                "source": "harness",
                "shape": BatchShape.parse(report["shape"]),
                "rule": report["run"],
                "lossless": report["lossless"],
                "copies_per_token": totals["rho"],
                "ms_per_token": totals["ms_per_sequence_token"],
                "ms_ci": totals["ms_per_sequence_token_ci"],
                "delta_nll": totals["delta_nll"],
                "prefill_copies": totals["prefill_copies"] / sequences if prefill else None,
                "prefill_ms": 1e3 * totals["prefill_seconds"] / sequences if prefill else None,
                "sequence_tokens": totals["timed_tokens"],
            }
        )
    return rows


def best_zoo(rows: list[dict], shape: BatchShape) -> dict | None:
    """The replayed zoo rule with the fewest copies at `shape`."""
    others = [
        r for r in rows if r["source"] == "replay" and r["shape"] == shape and r["rule"] in ZOO
    ]
    return min(others, key=lambda r: (r["copies_per_token"], r["rule"]), default=None)


def replayed(rows, shape, rule) -> dict | None:
    found = [
        r for r in rows if r["source"] == "replay" and r["shape"] == shape and r["rule"] == rule
    ]
    return found[0] if found else None


def oracle_saving(rows, shape) -> float | None:
    """farthest-future's saving as a share of LRU's copies at `shape`."""
    lru, oracle = replayed(rows, shape, BASELINE), replayed(rows, shape, ORACLE)
    if lru is None or oracle is None or not lru["copies_per_token"]:
        return None
    return 1 - oracle["copies_per_token"] / lru["copies_per_token"]


def shapes(rows, batching: str, prefill: int = 0) -> list[BatchShape]:
    found = {r["shape"] for r in rows if r["shape"].batching == batching}
    return sorted((s for s in found if s.prefill == prefill), key=lambda s: s.size)


def small_saving_batch(rows, batching: str) -> dict:
    """The smallest B at which farthest-future saves less than SMALL_SAVING of LRU's copies
    (None: not within the sizes run), with the saving at every B."""
    savings = {s.size: oracle_saving(rows, s) for s in shapes(rows, batching)}
    below = [b for b, saving in savings.items() if saving is not None and saving < SMALL_SAVING]
    first = min(below, default=None)
    # Whether every larger B stays below too (else "from B on" would overstate it).
    stays = first is not None and all(b in below for b in savings if b >= first)
    return {"batching": batching, "batch": first, "stays": stays, "savings": savings}


def restricting_quality(rows, batching: str = "static") -> dict:
    """Delta NLL of each restricting harness run against B (no prefill)."""
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        if r["source"] == "harness" and not r["lossless"] and r["shape"].batching == batching:
            if r["shape"].prefill == 0:
                out.setdefault(r["rule"], {})[r["shape"].size] = r["delta_nll"]
    return {rule: dict(sorted(by_b.items())) for rule, by_b in out.items()}
