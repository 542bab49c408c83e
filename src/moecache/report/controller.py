"""The controller appendix table: the threshold sweep of every heads file beside the simple
restricting policies on the same sequences, the seeds' spread, the priced sweep, the
comparisons at matched traffic and matched quality, and the longer-sequence test."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from moecache.atomic import read_json as read

HEADS_RUN = re.compile(r"^(?P<objective>[a-z]+)-s(?P<seed>\d+)(-e(?P<price>[0-9.]+))?-t(?P<t>\d+)$")
COLUMNS = [
    "run",
    "objective",
    "seed",
    "price",
    "threshold",
    "multiplier",
    "delta_nll",
    "tokens_per_second",
    "tokens_per_second_lo",
    "tokens_per_second_hi",
    "copies_per_token",
    "tokens_between_refreshes",
    "heads_share_pct",
]


def sweep_rows(sweep) -> pd.DataFrame:
    rows = []
    for folder in sweep:
        for path in sorted(Path(folder).glob("*.json")):
            report = read(path)
            totals, block = report["totals"], report.get("controller", {})
            found = HEADS_RUN.match(report["run"])
            rows.append(
                {
                    "run": report["run"],
                    "objective": found["objective"] if found else "",
                    "seed": int(found["seed"]) if found else None,
                    "price": float(found["price"]) if found and found["price"] else None,
                    "threshold": int(found["t"]) / 100 if found else None,
                    "multiplier": report["multiplier"],
                    "delta_nll": totals["delta_nll"],
                    "tokens_per_second": totals["tokens_per_second"],
                    "tokens_per_second_lo": totals["tokens_per_second_ci"][0],
                    "tokens_per_second_hi": totals["tokens_per_second_ci"][1],
                    "copies_per_token": totals["copies_per_token"],
                    "tokens_between_refreshes": block.get("tokens_between_refreshes"),
                    "heads_share_pct": 100 * block.get("heads_share", 0.0),
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def seeds_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """Per objective and threshold (unpriced, 1x): mean and standard error over seeds."""
    learned = rows[(rows["objective"] != "") & rows["price"].isna() & (rows["multiplier"] == 1)]
    keys = ["delta_nll", "copies_per_token", "tokens_between_refreshes", "heads_share_pct"]
    grouped = learned.groupby(["objective", "threshold"])[keys]
    mean, error = grouped.mean(), grouped.sem()
    frame = mean.join(error, rsuffix="_se").reset_index()
    frame.insert(2, "seeds", grouped.size().values)
    return frame


def matched(seeds: pd.DataFrame, reference: pd.DataFrame) -> list[str]:
    """Each objective's seed mean at each threshold against the simple policy nearest in
    traffic (how their losses compare) and nearest in quality (how their copies compare)."""
    lines = []
    if reference.empty:
        return lines
    for _, row in seeds.iterrows():
        traffic = reference.iloc[
            (reference["copies_per_token"] - row["copies_per_token"]).abs().argmin()
        ]
        quality = reference.iloc[(reference["delta_nll"] - row["delta_nll"]).abs().argmin()]
        between = row["tokens_between_refreshes"]
        ratio = row["copies_per_token"] / max(quality["copies_per_token"], 1e-9)
        lines.append(
            f"- {row['objective']}, threshold {row['threshold']:g} (mean of {row['seeds']} "
            f"seeds): Delta NLL {row['delta_nll']:+.3f} at {row['copies_per_token']:.2f} "
            f"copies/token, {every(between)}. Matched traffic: "
            f"{traffic['run']} {traffic['delta_nll']:+.3f} at "
            f"{traffic['copies_per_token']:.2f}. Matched quality: {quality['run']} "
            f"({quality['delta_nll']:+.3f}) copies {quality['copies_per_token']:.2f}, the "
            f"controller {ratio:.2f}x as many."
        )
    return lines


def every(between: float) -> str:
    return (
        "no refresh after the first token"
        if pd.isna(between)
        else (f"a refresh every {between:.1f} tokens")
    )


def longer_frame(longer) -> tuple[pd.DataFrame, list[str]]:
    rows, lines = [], []
    for folder in longer:
        summary = read(Path(folder) / "summary.json")
        for label in ("pieces", "whole"):
            tokens = summary["piece_tokens"] if label == "pieces" else summary["tokens"]
            for name, row in summary[label].items():
                rows.append({"run": name, "decoded_as": label, "sequence_tokens": tokens, **row})
        frame = pd.DataFrame(rows)
        for name in summary["whole"]:
            if not name.startswith("controller"):
                continue
            for other in summary["whole"]:
                if other.startswith("controller"):
                    continue
                gap = {
                    label: summary[label][name]["delta_nll"] - summary[label][other]["delta_nll"]
                    for label in ("pieces", "whole")
                }
                moved = gap["whole"] - gap["pieces"]
                side = "toward" if moved < 0 else "away from"
                lines.append(
                    f"- {name} minus {other}, Delta NLL: {gap['pieces']:+.3f} in pieces of "
                    f"{summary['piece_tokens']} tokens, {gap['whole']:+.3f} on whole sequences "
                    f"of {summary['tokens']}: whole sequences move it {moved:+.3f} nats, "
                    f"{side} the controller (the conjecture expects toward)."
                )
        return frame, lines
    return pd.DataFrame(
        columns=["run", "decoded_as", "sequence_tokens", "delta_nll", "copies_per_token"]
    ), lines


def training_lines(controller) -> list[str]:
    logs = [read(Path(path).with_suffix(".json")) for path in controller]
    if not logs:
        return []
    lower = sum(log["log"][-1]["objective"] < log["log"][0]["objective"] for log in logs)
    steps = sorted({log["steps"] for log in logs})
    return [
        f"Training: {len(logs)} heads files, {', '.join(map(str, steps))} steps each; the "
        f"objective on the last batch is below the first batch's in {lower} of them (batches "
        "differ, so this is a trend, not a test: tests/test_controller.py shows training "
        "lowering it on a fixed batch)."
    ]
