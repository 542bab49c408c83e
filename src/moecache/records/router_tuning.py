"""The router-tuning stage's files: a variant's training log (`moecache router-train`:
results/router_tuning/<variant>/training.json, `TuningLog`), which the measure step folds
into its own file, and one model measured in the harness (`moecache router-measure`:
results/router_tuning/measured/<model>.json, `TunedModel`), which Table 3 and the
scorecard read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from moecache.records.stamped import SCHEMA, Stamped


@dataclass(frozen=True, kw_only=True)
class TuningLog(Stamped):
    what: ClassVar[str] = "a router tuning's training log"

    schema: int = SCHEMA
    variant: str
    source: str
    steps: int
    prompts: int
    completions_per_step: int
    log_sim_hit_rate: dict | None  # start and end quarters' means (None: not logged)
    log_reward: dict | None
    greedy_sim_hit_rate: dict
    merge_max_logit_gap: float
    log: list
    seconds: float


@dataclass(frozen=True, kw_only=True)
class TunedModel(Stamped):
    what: ClassVar[str] = "a router-tuned model's measurement"

    schema: int = SCHEMA
    model: str  # base or a variant
    source: str
    nll_comparable: bool  # the tagged variant scores its tag's tokens too
    teacher_forced: dict
    own_generations: dict
    training: dict | None  # the training log's summary (None: the base model)
