"""The overlap section: per copy multiplier, each overlapped run (`overlap: true`) beside
the blocking run of the same policy, ms per token with 95% intervals, stall and the
prefetcher's accuracy and waste; then the verdicts the README states, decided from the
results: whether farthest-future's advantage over LRU survives overlap at each multiplier,
the copy-to-compute ratio below which the eviction rule stops mattering, and whether every
overlapped run is within 10% of the overlap cost model (costs/overlap.py)."""

from __future__ import annotations

from pathlib import Path

from moecache.costs import overlap
from moecache.policies import POLICIES
from moecache.records.gates import POOL_TOLERANCE
from moecache.records.io import read_run_dict
from moecache.report.numbers.format import fixed, percent, sig, table
from moecache.report.tables.overlap import blocking_twin, overlapped

BASELINE, ORACLE = "lru", "farthest-future"


def overlap_section(workdir: Path, shard: str) -> str:
    paths = sorted((workdir / f"results/runs/{shard}").glob("*.json"))
    reports = [read_run_dict(path) for path in paths]
    if not any(overlapped(r) for r in reports):
        return "Not produced by this run: no overlapped run (harness.runs.NAME.overlap: true)."
    multipliers = sorted({r["multiplier"] for r in reports if overlapped(r)})
    parts = [multiplier_table(reports, m) for m in multipliers]
    lines = [advantage_line(advantage(reports, m)) for m in multipliers]
    lines += [stops_mattering_line(reports), model_line(reports), compute_line(reports)]
    lines += [nll_line(reports)]
    return "\n\n".join([*parts, "\n".join(f"- {line}" for line in lines)])


def ms(totals: dict) -> str:
    """ms per token with its 95% interval."""
    low, high = totals["step_ms_ci"]
    return f"{fixed(totals['step_ms'], 2)} ({fixed(low, 2)}-{fixed(high, 2)})"


def multiplier_table(reports: list[dict], multiplier) -> str:
    blocking = [r for r in reports if not overlapped(r)]
    rows = []
    for r in (r for r in reports if overlapped(r) and r["multiplier"] == multiplier):
        totals, twin = r["totals"], blocking_twin(r, blocking)
        fetched = totals["prefetch_copies"]
        rows.append(
            [
                r["run"],
                r["prefetch"],
                f"{twin['run']}: {ms(twin['totals'])}" if twin else "n/a",
                ms(totals),
                fixed(totals["stall_ms"], 2),
                fixed(totals["hidden_copy_ms"], 2),
                percent(totals["prefetch_accuracy"]),
                percent(totals["prefetch_wasted"] / fetched if fetched else None),
            ]
        )
    header = [
        f"{multiplier:g}x: overlapped run",
        "prefetch",
        "blocking ms/token (95%)",
        "overlapped ms/token (95%)",
        "stall ms/token",
        "hidden copy ms/token",
        "prefetch accuracy",
        "prefetches wasted",
    ]
    return table(header, rows)


def candidates(reports: list[dict], policy: str, multiplier) -> list[dict]:
    """The overlapped runs of `policy` at `multiplier`, without parameters (farthest-future
    with unlimited foresight)."""
    return [
        r
        for r in reports
        if overlapped(r)
        and r["multiplier"] == multiplier
        and r["policy"] == policy
        and not r.get("params")
    ]


def advantage(reports: list[dict], multiplier) -> dict:
    """Whether the overlapped farthest-future run's ms/token interval lies wholly below the
    overlapped LRU run's at `multiplier` (the same prefetcher's where both have one).
    `survives` is None when either run is missing, `missing` then names it."""
    oracle = candidates(reports, ORACLE, multiplier)
    baseline = candidates(reports, BASELINE, multiplier)
    verdict = {"multiplier": multiplier, "survives": None, "missing": None}
    if not oracle or not baseline:
        verdict["missing"] = ORACLE if not oracle else BASELINE
        return verdict
    o, b = overlap.prefetch_pair(oracle, baseline)
    saving = 1 - o["totals"]["step_ms"] / b["totals"]["step_ms"]
    survives = o["totals"]["step_ms_ci"][1] < b["totals"]["step_ms_ci"][0]
    return {**verdict, "survives": survives, "oracle": o, "baseline": b, "saving": saving}


def advantage_line(verdict: dict) -> str:
    head = f"farthest-future's advantage over LRU survives overlap at {verdict['multiplier']:g}x:"
    if verdict["survives"] is None:
        return f"{head} not measured (no overlapped {verdict['missing']} run at that multiplier)."
    o, b = verdict["oracle"], verdict["baseline"]
    return (
        f"{head} {'yes' if verdict['survives'] else 'no'} ({o['run']} {ms(o['totals'])} "
        f"ms/token against {b['run']} {ms(b['totals'])}: {percent(verdict['saving'])} saved)."
    )


def stops_mattering_line(reports: list[dict]) -> str:
    found = overlap.stops_mattering(reports)
    if found is None:
        return (
            "The overlap cost model cannot say at which copy-to-compute ratio the eviction "
            "rule stops mattering under overlap."
        )
    return (
        "Under overlap the eviction rule stops mattering below a copy-to-compute ratio of "
        f"{sig(found['ratio'])} (LRU's copies per token x tau over c, at tau = "
        f"{sig(found['tau_ms'])} ms): there the overlap cost model puts {found['ff']}'s stall "
        f"within {percent(found['share'])} of a step of {found['lru']}'s."
    )


def model_line(reports: list[dict]) -> str:
    rows = overlap.model_rows(reports, strict=False)
    if not rows:
        return "Every overlapped run within 10% of the overlap cost model: no run to check."
    worst = max(rows, key=lambda row: abs(row["relative_error"]))
    within = all(row["within_10pct"] for row in rows)
    return (
        "Every overlapped run within 10% of the overlap cost model: "
        f"{'yes' if within else 'no'} (largest error {worst['relative_error']:+.1%}, "
        f"{worst['run']} at {worst['multiplier']:g}x)."
    )


def compute_line(reports: list[dict]) -> str:
    """How far a slowed copy worker moved the compute: each overlapped run's step less
    stall at m > 1 against its 1x twin's."""
    rows = [r for r in overlap.model_rows(reports, strict=False) if r["multiplier"] > 1]
    if not rows:
        return "The compute beside a slowed copy worker: no overlapped run above 1x."
    ratios = [row["compute_ratio_to_1x"] - 1 for row in rows]
    worst = max(rows, key=lambda row: abs(row["compute_ratio_to_1x"] - 1))
    return (
        "The compute beside a slowed copy worker (step less stall, against the 1x twin's): "
        f"{min(ratios):+.1%} to {max(ratios):+.1%} (largest {worst['run']} at "
        f"{worst['multiplier']:g}x)."
    )


def nll_line(reports: list[dict]) -> str:
    """Whether the lossless overlapped runs kept the base NLL (the gates' tolerance)."""
    lossless = [r for r in reports if overlapped(r) and not POLICIES[r["policy"]].restricts]
    if not lossless:
        return "No lossless overlapped run to hold to the base NLL."
    worst = max(lossless, key=lambda r: abs(r["totals"]["delta_nll"]))
    gap = abs(worst["totals"]["delta_nll"])
    kept = "yes" if gap <= POOL_TOLERANCE else "no"
    return (
        f"Lossless overlapped runs keep the base NLL within the gates' tolerance "
        f"({POOL_TOLERANCE:.0e}): {kept} (largest |Delta NLL| {gap:.1e}, {worst['run']} "
        f"at {worst['multiplier']:g}x, of {len(lossless)} runs)."
    )
