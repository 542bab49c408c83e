"""The controller stage's JSON files: a heads file's training log (`moecache
controller-train`: results/controller/heads/<name>.json beside its weights, `HeadsLog`)
and the longer-sequence test's summary (`moecache controller-longer`: results/controller/
longer/summary.json, `LongerSummary`); the controller table reads both. Its decode runs are
records/run.py's RunResult."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from moecache.records.record import Record

SCHEMA = 1  # the controller's files' version: a field added, removed or changed bumps it


@dataclass(frozen=True, kw_only=True)
class HeadsLog(Record):
    what: ClassVar[str] = "a controller heads file's log"
    version: ClassVar[int] = SCHEMA

    schema: int = SCHEMA
    objective: str  # differentiable or reinforce
    seed: int
    price: float
    tau_ms: float
    weights: dict
    capacity: int
    steps: int
    train_seconds: float
    log: list  # one entry per step


@dataclass(frozen=True, kw_only=True)
class LongerSummary(Record):
    what: ClassVar[str] = "a longer-sequence summary"
    version: ClassVar[int] = SCHEMA

    schema: int = SCHEMA
    tokens: int  # a whole sequence's tokens
    piece_tokens: int  # a piece's (the held-out sequences' length)
    heads: str  # the heads file of the controller runs
    whole: dict  # run -> delta_nll, copies_per_token decoded whole
    pieces: dict  # the same decoded in pieces
