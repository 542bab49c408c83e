"""Table 2: multiple-choice accuracy at a matched switch rate."""

from __future__ import annotations

import numpy as np
import pandas as pd

from moecache.records.accuracy import AccuracySummary
from moecache.records.io import read_dict
from moecache.report.tables.base import Table, not_produced
from moecache.runs import AccuracyRowName

TABLE2_COLUMNS = [
    "task",
    "row",
    "threshold",
    "accuracy",
    "accuracy_lo",
    "accuracy_hi",
    "retention",
    "retention_lo",
    "retention_hi",
    "retention_se",
    "switch_rate",
    "copies_per_token",
]
TABLE2_ROWS = {
    "free": "Free routing",
    "oracle-set": "Fixed set, oracle selection",
    "recent-use": "Fixed set, chosen from recent use",
}


def table2(accuracy=()) -> Table:
    """Per task, every row's accuracy and retention against free routing (95% intervals
    over the questions), the controller seeds' mean with one standard error, the measured
    switch rate and copies per token; per-question outputs beside each summary."""
    title = "Table 2. Multiple-choice accuracy at a matched switch rate"
    if not accuracy:
        return not_produced(
            "table2", title, "needs the accuracy stage (config section accuracy)", TABLE2_COLUMNS
        )
    rows, notes = [], []
    for path in accuracy:
        report = read_dict(path, AccuracySummary)
        task = report["task"].removeprefix("moecache_")
        measured, seeds = policy_rows(report, task)
        rows += measured + seed_means(task, seeds)
        notes.append(task_note(report, task))
    return Table(
        "table2",
        title,
        "Scored by lm-eval (log-likelihood of each choice) on the pooled model, one policy "
        "per row over the restricted layers; the blocks restart at each question (the "
        "controller keeps its cached set, as across sequences). Retention is accuracy over "
        "free routing's on the same questions; lo, hi: 95% bootstrap intervals over the "
        "questions; retention_se: one standard error across the controller's seeds. "
        "switch_rate: refreshes per token and restricted layer, as measured on the task "
        "(Dwell's warm start refreshes every token until its window fills); "
        "copies_per_token over all restricted layers.",
        {"": pd.DataFrame(rows, columns=TABLE2_COLUMNS)},
        sources=list(accuracy),
        notes=notes,
    )


def policy_rows(report: dict, task: str) -> tuple[list[dict], dict[str, list[dict]]]:
    """One task's rows as the summary lists them (one a policy, one a controller seed),
    and the controller seeds' summary rows grouped by their operating point."""
    rows, seeds = [], {}
    for row in report["rows"]:
        name = row["row"]
        label = TABLE2_ROWS.get(name)
        if label is None:  # one controller seed's row
            controller = AccuracyRowName.parse(name)
            label = f"Learned, seed {controller.seed} ({controller.point})"
            seeds.setdefault(controller.point, []).append(row)
        rows.append(
            {
                "task": task,
                "row": label,
                "threshold": row["params"].get("threshold"),
                "accuracy": row["accuracy"],
                "accuracy_lo": row["accuracy_ci"][0],
                "accuracy_hi": row["accuracy_ci"][1],
                "retention": row["retention"],
                "retention_lo": row["retention_ci"][0],
                "retention_hi": row["retention_ci"][1],
                "retention_se": None,
                "switch_rate": row["switch_rate"],
                "copies_per_token": row["copies_per_token"],
            }
        )
    return rows, seeds


def seed_means(task: str, seeds: dict[str, list[dict]]) -> list[dict]:
    """Per operating point with two seeds or more: the seeds' mean, its retention with one
    standard error across the seeds (one seed has no spread to show)."""
    rows = []
    for point, group in seeds.items():
        if len(group) < 2:
            continue
        retention = np.array([r["retention"] for r in group], dtype=float)  # None: nan
        se = float(retention.std(ddof=1) / np.sqrt(len(group)))
        rows.append(
            {
                "task": task,
                "row": f"Learned, mean of {len(group)} seeds ({point})",
                "accuracy": float(np.mean([r["accuracy"] for r in group])),
                "retention": float(retention.mean()),
                "retention_se": se,
                "switch_rate": float(np.mean([r["switch_rate"] for r in group])),
                "copies_per_token": float(np.mean([r["copies_per_token"] for r in group])),
            }
        )
    return rows


def task_note(report: dict, task: str) -> str:
    """The task's note: its questions, chance, free routing's accuracy, the switch period
    and each seed's matched threshold."""
    free = next(r for r in report["rows"] if r["row"] == "free")
    matched = ", ".join(f"seed {s}: {t:g}" for s, t in report["matched_thresholds"].items())
    return (
        f"{task}: {report['questions']} questions, chance {report['chance']:.3f}; free "
        f"routing {free['accuracy']:.3f} ({free['accuracy_ci'][0]:.3f}-"
        f"{free['accuracy_ci'][1]:.3f}); fixed sets every {report['switch_every']} tokens; "
        f"matched thresholds (held-out refreshes per token nearest "
        f"1/{report['switch_every']}): {matched}."
    )
