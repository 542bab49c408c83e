"""Table 1's overlapped part: each run whose copies overlap compute (`overlap: true`) beside
the blocking run of the same policy at the same copy multiplier: ms per token of both with
intervals, the stall and the copy time hidden under compute, demand and prefetch copies,
and the prefetcher's accuracy and waste (harness/overlap.py counts them), with the overlap
cost model's prediction and its error (costs/overlap.py)."""

from __future__ import annotations

import pandas as pd

from moecache.costs import overlap
from moecache.records.io import read_run_dict


def overlapped(report: dict) -> bool:
    return bool(report.get("overlap"))


def blocking_twin(report: dict, blocking: list[dict]) -> dict | None:
    """The blocking run of the same policy, parameters and multiplier, if one was decoded."""
    same = [
        b
        for b in blocking
        if (b["policy"], b.get("params", {}), b["multiplier"])
        == (report["policy"], report.get("params", {}), report["multiplier"])
    ]
    return same[0] if same else None


def overlapped_frame(paths) -> pd.DataFrame:
    reports = [read_run_dict(path) for path in paths]
    blocking = [r for r in reports if not overlapped(r)]
    rows = []
    for r in (r for r in reports if overlapped(r)):
        totals, twin = r["totals"], blocking_twin(r, blocking)
        timed = totals["timed_tokens"]
        low, high = totals["step_ms_ci"]
        rows.append(
            {
                "run": r["run"],
                "policy": r["policy"],
                "prefetch": r["prefetch"],
                "multiplier": r["multiplier"],
                "ms_per_token": totals["step_ms"],
                "ms_lo": low,
                "ms_hi": high,
                "blocking_run": twin["run"] if twin else None,
                "blocking_ms_per_token": twin["totals"]["step_ms"] if twin else None,
                "stall_ms": totals["stall_ms"],
                "hidden_copy_ms": totals["hidden_copy_ms"],
                "demand_copies_per_token": totals["demand_copies"] / timed,
                "prefetch_copies_per_token": totals["prefetch_copies"] / timed,
                "prefetch_accuracy": totals["prefetch_accuracy"],
                "prefetch_wasted": totals["prefetch_wasted"],
                "delta_nll": totals["delta_nll"],
            }
        )
    frame = pd.DataFrame(rows)
    model = pd.DataFrame(overlap.model_rows(reports, strict=False))
    if frame.empty or model.empty:
        return frame
    keep = ["run", "multiplier", "c_ms", "c_overlap_ms", "compute_ratio_to_1x"]
    keep += ["tau_ms", "tau_blocking_ms"]
    keep += ["predicted_ms", "relative_error", "within_10pct"]
    return frame.merge(model[keep], on=["run", "multiplier"], how="left")
