"""The embedded model's training log (`moecache train`: results/model/training.json
beside its weights, `ModelTraining`); the report's numbers read its size and loss curve."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from moecache.records.record import Record

SCHEMA = 1  # the training log's version: a field added, removed or changed bumps it


@dataclass(frozen=True, kw_only=True)
class ModelTraining(Record):
    what: ClassVar[str] = "a model's training log"
    version: ClassVar[int] = SCHEMA

    schema: int = SCHEMA
    training_tokens: int
    tokens_seen: int
    parameters: int
    log: list  # one entry per step: step, lm_loss, aux_loss
