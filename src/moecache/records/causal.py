"""The causal rules' study (learned/causal.py, results/learned/causal.json) as a typed record.

`tuning`: per candidate rule, the parameter grid tried on the training trace's fitting
sequences, each point's mean share of the gap there over the capacities, and the point
chosen; `next_use`: the fitted model's and its shuffled-label control's summaries and files,
every variant tried with its share on the validation sequences, and the one chosen there;
`validation`: every rule's mean share on the training trace's validation sequences, and
`chosen`, the rule picked there (the one the report and the scorecard speak of); `shards`:
per trace shard and capacity (as text, JSON keys), every rule's copies on the shard's
sequences (all held out: nothing was tuned, fitted or chosen on them), its share of the
LRU-to-farthest-future
gap and a percentile bootstrap interval of that share over sequences; last, what it
traces back to (records/replay.py's Traced: settings, input files by SHA-256, versions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from moecache.records.replay import TRACED, Traced

SCHEMA = 1


@dataclass(frozen=True, kw_only=True)
class CausalStudy(Traced):
    version: ClassVar[int] = SCHEMA
    what: ClassVar[str] = "the causal eviction rules' study"
    optional: ClassVar[tuple[str, ...]] = ("settings", "device", *TRACED)

    schema: int = SCHEMA
    seed: int
    capacities: list
    training_sequences: int  # the training trace's sequences fitted and tuned on
    validation_sequences: int  # its sequences held apart, on which every choice was made
    validation: dict  # rule -> mean share of the gap on the validation sequences
    chosen: str  # the rule with the highest share there
    tuning: dict  # rule -> {"grid": [{params, share}], "chosen": params}
    next_use: dict  # {"model": summary, "control": summary}
    shards: dict  # shard -> str(C) -> {"sequences", "rules": {rule: {copies, share, interval}}}
    settings: dict | None = None  # the config sections it read (stamped)
    device: str | None = None  # where it ran: the CPU

    def best(self) -> dict:
        """The rule chosen on the validation sequences (never on the shards, which only
        report) and its rows: {"rule", "rows": {shard: {C: row}}}."""
        rule = self.chosen
        rows = {
            shard: {c: row["rules"][rule] for c, row in by_c.items()}
            for shard, by_c in self.shards.items()
        }
        return {"rule": rule, "rows": rows}


@dataclass(frozen=True, kw_only=True)
class CausalCheck(Traced):
    """The causal rules decoding in the harness against their replay, and what their
    decisions cost (learned/causal_check.py, results/learned/causal-check.json).

    `closed_loop`: per shard of learned.causal.closed_loop, per rule, the harness's copies
    per sequence beside the replay's of the same sequences and whether they are equal;
    `cost`: on `cost_shard`'s first sequences, every rule's change() time per decision (one
    layer's plan for one token) with its interval over streams, its extra time over LRU's
    (paired), the copies it saves per decision and their worth at `tau_ms` a copy, and the
    worth less the extra time (`net_ns`: negative, it costs more than it saves at 1x)."""

    version: ClassVar[int] = SCHEMA
    what: ClassVar[str] = "the causal rules' closed-loop check and cost per decision"
    optional: ClassVar[tuple[str, ...]] = ("settings", "device", *TRACED)

    schema: int = SCHEMA
    seed: int
    capacity: int  # the harness's: the closed loop's and the timing's
    closed_loop: dict  # shard -> rule -> {closed_loop, replay: {seq: copies}, copies, equal}
    cost_shard: str
    cost_sequences: list  # the sequences timed
    rounds: int
    tau_ms: float  # one expert's copy at 1x (the bandwidth record's)
    cost: dict  # {"decisions", "streams", "rules": {rule: {ns_per_decision, ...}}}
    settings: dict | None = None
    device: str | None = None

    def all_equal(self) -> bool:
        """Whether every rule's closed-loop copies equal its replay's, on every shard."""
        return all(row["equal"] for rules in self.closed_loop.values() for row in rules.values())


REFERENCES = ("lru", "farthest-future")  # the gap's ends, in every capacity's rules
CONTROL = "-permuted"  # a shuffled-label control's suffix
