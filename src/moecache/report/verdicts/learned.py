"""What the learned eviction scorers achieve, decided on `results/learned/evaluation.json`:
the best scorer on the held-out sequences of every shard, whether every scorer beats
decayed frequency there, and whether the best recovers half of the LRU-to-oracle gap.
The report renders it (moecache.report.numbers.stages)."""

from __future__ import annotations

from dataclasses import dataclass

CONTROLS = ("lru", "oracle")  # the gap's two ends: not scorers


@dataclass(frozen=True)
class LearnedVerdict:
    best: str | None  # the learned scorer whose worst held-out share is the highest
    worst: dict[str, float]  # each learned scorer's lowest held-out share over its shards
    beats_decayed: bool  # every learned scorer above decayed frequency on its shards
    half_of_gap: bool  # the best one recovers at least half the gap on every shard


def scorers(evaluation: dict) -> list[str]:
    """Every rule replayed on some shard's held-out sequences, the gap's ends aside."""
    return list(
        dict.fromkeys(
            name
            for result in evaluation["shards"].values()
            for name in result["replay"]["heldout"]
            if name not in CONTROLS
        )
    )


def learned_verdict(evaluation: dict) -> LearnedVerdict:
    """The learned scorers (named `<features>/<model>`, the permuted-label controls aside)
    against each other and against decayed frequency on the held-out sequences."""
    heldout = {s: r["replay"]["heldout"] for s, r in evaluation["shards"].items()}
    learned = [n for n in scorers(evaluation) if "/" in n and not n.endswith("-permuted")]
    worst = {n: min(h[n]["gap_recovered"] for h in heldout.values() if n in h) for n in learned}
    everywhere = [n for n in learned if all(n in h for h in heldout.values())]
    best = max(everywhere or learned, key=lambda n: worst[n], default=None)
    beats = all(
        h[n]["gap_recovered"] > h["decayed-frequency"]["gap_recovered"]
        for h in heldout.values()
        for n in learned
        if n in h
    )
    return LearnedVerdict(best, worst, beats, best is not None and worst[best] >= 0.5)
