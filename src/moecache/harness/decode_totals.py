"""What a decoded arm reports (decode.py): each sequence's row, as the arm's pools counted
and timed it, and the totals over the rows, with bootstrap intervals over the sequences
(the batched runs total their batch rows the same way)."""

from __future__ import annotations

from moecache.harness import overlap
from moecache.intervals import bootstrap_ratio


def sequence_row(ids, s: dict) -> dict:
    pools = s["pools"]
    return {
        "tokens": len(ids),
        "nll_sum": s["nll_sum"],
        "scored": len(ids) - 1,
        "timed_tokens": len(ids) - 1,
        # A charged link's time is in its laps and, here, in the steps (the first token's
        # charge went with its counts).
        "step_seconds": s["step_seconds"] + sum(p.charged for p in pools),
        "copy_seconds": sum(lap.seconds() for p in pools for lap in p.laps),
        "timed_copies": sum(p.fills + p.steady for p in pools),
        "copy_groups": sum(p.groups for p in pools),
        "fills": s["first_fills"] + sum(p.fills for p in pools),
        "steady": sum(p.steady for p in pools),
        **overlap.sequence_counts(pools),  # overlapped runs only
    }


def totals(rows, repeats: int = 1, seed: int = 0) -> dict:
    def total(key):
        return sum(r[key] for r in rows)

    timed, steps, copy_s = total("timed_tokens"), total("step_seconds"), total("copy_seconds")
    copies, groups = total("timed_copies"), total("copy_groups")
    tokens = [r["timed_tokens"] for r in rows]
    step_ci = bootstrap_ratio([1e3 * r["step_seconds"] for r in rows], tokens, seed)
    compute_ci = bootstrap_ratio(
        [1e3 * (r["step_seconds"] - r["copy_seconds"]) for r in rows], tokens, seed
    )
    return {
        "nll": total("nll_sum") / total("scored"),
        "scored_tokens": total("scored"),
        "timed_tokens": timed,
        "tokens_per_second": timed / steps,
        "tokens_per_second_ci": [1e3 / step_ci[1], 1e3 / step_ci[0]],
        "fills": total("fills"),
        "steady_copies": total("steady"),
        "rho": total("steady") / timed,
        "timed_copies": copies,
        "copies_per_token": copies / timed,
        "copy_groups": groups,
        "groups_per_token": groups / timed,
        "tau_ms": 1e3 * copy_s / copies if copies else None,
        "copy_ms": 1e3 * copy_s / timed,
        "copy_share": copy_s / steps,
        "compute_ms": 1e3 * (steps - copy_s) / timed,
        "compute_ms_ci": compute_ci,
        "step_ms": 1e3 * steps / timed,
        "step_ms_ci": step_ci,
        "repeats": repeats,
        **overlap.totals(rows),  # overlapped runs only
    }
