"""The learned scorers' evaluation (`moecache learned-evaluate`: results/learned/
evaluation.json, `LearnedEvaluation`): per shard, the held-out sequences and, on them and on
all, every scorer's, decayed frequency's and the references' copies replayed with each one's
share of the LRU-to-farthest-future gap and foresight equivalent, the closed-loop runs beside
them; the scorers' training summaries. The learned table, figure 2, the numbers and the
scorecard read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from moecache.records.stamped import SCHEMA, Stamped


@dataclass(frozen=True, kw_only=True)
class LearnedEvaluation(Stamped):
    version: ClassVar[int] = SCHEMA
    what: ClassVar[str] = "the learned scorers' evaluation"

    schema: int = SCHEMA
    capacity: int  # the harness's C, where the scorers were trained and replayed
    shards: dict  # shard -> {"heldout_sequences", "replay": {part: {rule: row}}, "closed_loop"}
    training: dict  # scorer -> its fit's summary (learned/fit.py)
    inputs: list
