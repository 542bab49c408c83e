"""How the learned controller compares with the simple restricting policies decoded on the
same sequences: at matched traffic (their losses), at matched quality (their copies), and
on sequences longer than it was trained on. Decided here, on the sweep's and the longer
test's results; rendered by the report (moecache.report.controller). And whether a heads
file's training reached a plateau, which the scorecard's controller claims need."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from moecache.report.power import Plateau, plateau


@dataclass(frozen=True)
class Matched:
    """One objective's seed mean at one threshold against the simple run nearest in
    copies per token (traffic) and the one nearest in Delta NLL (quality)."""

    objective: str
    threshold: float
    seeds: int
    delta_nll: float
    copies_per_token: float
    tokens_between_refreshes: float  # NaN: no refresh after the first token
    traffic_run: str
    traffic_delta_nll: float
    traffic_copies_per_token: float
    quality_run: str
    quality_delta_nll: float
    quality_copies_per_token: float

    @property
    def copies_ratio(self) -> float:
        """The controller's copies per token over the quality-matched run's."""
        return self.copies_per_token / max(self.quality_copies_per_token, 1e-9)


def nearest(reference: pd.DataFrame, column: str, value: float) -> pd.Series:
    return reference.iloc[(reference[column] - value).abs().argmin()]


def matched(seeds: pd.DataFrame, reference: pd.DataFrame) -> list[Matched]:
    """Each row of the seeds frame (objective x threshold) against `reference`, the simple
    restricting runs at 1x; none without them."""
    if reference.empty:
        return []
    out = []
    for _, row in seeds.iterrows():
        traffic = nearest(reference, "copies_per_token", row["copies_per_token"])
        quality = nearest(reference, "delta_nll", row["delta_nll"])
        out.append(
            Matched(
                row["objective"],
                row["threshold"],
                int(row["seeds"]),
                row["delta_nll"],
                row["copies_per_token"],
                row["tokens_between_refreshes"],
                traffic["run"],
                traffic["delta_nll"],
                traffic["copies_per_token"],
                quality["run"],
                quality["delta_nll"],
                quality["copies_per_token"],
            )
        )
    return out


@dataclass(frozen=True)
class Longer:
    """A controller run minus a simple run, Delta NLL, in pieces of the standard length
    and on whole sequences several times longer."""

    controller: str
    other: str
    piece_tokens: int
    tokens: int
    in_pieces: float
    whole: float

    @property
    def moved(self) -> float:
        """Whole sequences minus pieces: negative moves the gap toward the controller
        (what the paper's conjecture expects)."""
        return self.whole - self.in_pieces

    @property
    def toward_controller(self) -> bool:
        return self.moved < 0


def longer(summary: dict) -> list[Longer]:
    """Every controller run against every simple run of one longer-sequence summary."""
    runs = summary["whole"]
    controllers = [name for name in runs if name.startswith("controller")]
    others = [name for name in runs if not name.startswith("controller")]

    def gap(label: str, name: str, other: str) -> float:
        return summary[label][name]["delta_nll"] - summary[label][other]["delta_nll"]

    return [
        Longer(
            name,
            other,
            summary["piece_tokens"],
            summary["tokens"],
            gap("pieces", name, other),
            gap("whole", name, other),
        )
        for name in controllers
        for other in others
    ]


def heads_plateau(log: dict) -> Plateau | None:
    """Whether a heads file's training objective (HeadsLog as a dict: one value a step)
    reached a plateau (None: under 6 steps, too few to tell)."""
    return plateau([entry["objective"] for entry in log["log"]])
