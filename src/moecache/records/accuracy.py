"""The accuracy stage's summary of one task (`moecache accuracy`: results/accuracy/<task>/
summary.json, `AccuracySummary`): every row of Table 2 at the thresholds matched to the
simple runs' refresh rates; Table 2, the numbers and the scorecard read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from moecache.records.stamped import SCHEMA, Stamped


@dataclass(frozen=True, kw_only=True)
class AccuracySummary(Stamped):
    what: ClassVar[str] = "an accuracy summary"

    schema: int = SCHEMA
    task: str
    questions: int
    chance: float
    switch_every: float
    matched_thresholds: dict  # switch_every -> the controller's threshold
    rows: list
