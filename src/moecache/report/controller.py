"""The controller appendix table: the threshold sweep of every heads file beside the simple
restricting policies on the same sequences, the seeds' spread, the priced sweep, the
comparisons at matched traffic and matched quality, and the longer-sequence test."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from moecache.records.controller import HeadsLog, LongerSummary
from moecache.records.io import read_dict, read_run_dict
from moecache.report.verdicts import controller as verdicts
from moecache.runs import SweepRunName

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
            report = read_run_dict(path)
            totals, block = report["totals"], report.get("controller") or {}
            found = SweepRunName.parse(report["run"])
            rows.append(
                {
                    "run": report["run"],
                    "objective": found.heads.objective if found else "",
                    "seed": found.heads.seed if found else None,
                    "price": found.heads.price if found else None,
                    "threshold": found.threshold if found else None,
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
    """The controller against the simple policies at matched traffic and quality
    (decided in moecache.report.verdicts.controller), one sentence each."""
    return [
        f"- {m.objective}, threshold {m.threshold:g} (mean of {m.seeds} "
        f"seeds): Delta NLL {m.delta_nll:+.3f} at {m.copies_per_token:.2f} "
        f"copies/token, {every(m.tokens_between_refreshes)}. Matched traffic: "
        f"{m.traffic_run} {m.traffic_delta_nll:+.3f} at "
        f"{m.traffic_copies_per_token:.2f}. Matched quality: {m.quality_run} "
        f"({m.quality_delta_nll:+.3f}) copies {m.quality_copies_per_token:.2f}, the "
        f"controller {m.copies_ratio:.2f}x as many."
        for m in verdicts.matched(seeds, reference)
    ]


def every(between: float) -> str:
    return (
        "no refresh after the first token"
        if pd.isna(between)
        else (f"a refresh every {between:.1f} tokens")
    )


def longer_frame(longer) -> tuple[pd.DataFrame, list[str]]:
    """The first longer-sequence summary's rows, and the controller against each simple
    run in pieces and whole (decided in moecache.report.verdicts.controller), one sentence each."""
    for folder in longer:
        summary = read_dict(Path(folder) / "summary.json", LongerSummary)
        rows = [
            {"run": name, "decoded_as": label, "sequence_tokens": tokens, **row}
            for label, tokens in (("pieces", summary["piece_tokens"]), ("whole", summary["tokens"]))
            for name, row in summary[label].items()
        ]
        lines = [
            f"- {g.controller} minus {g.other}, Delta NLL: {g.in_pieces:+.3f} in pieces of "
            f"{g.piece_tokens} tokens, {g.whole:+.3f} on whole sequences "
            f"of {g.tokens}: whole sequences move it {g.moved:+.3f} nats, "
            f"{'toward' if g.toward_controller else 'away from'} the controller (the "
            "conjecture expects toward)."
            for g in verdicts.longer(summary)
        ]
        return pd.DataFrame(rows), lines
    return pd.DataFrame(
        columns=["run", "decoded_as", "sequence_tokens", "delta_nll", "copies_per_token"]
    ), []


def training_lines(controller) -> list[str]:
    logs = [read_dict(Path(path).with_suffix(".json"), HeadsLog) for path in controller]
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
