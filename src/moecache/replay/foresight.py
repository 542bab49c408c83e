"""Limited foresight: the share of the LRU-to-oracle gap farthest-future eviction recovers
when it sees only the next k tokens of demand (the data of Figure 2), on the held-out
sequences and on all, with the causal rules as reference lines."""

from __future__ import annotations

import numpy as np

from moecache.records.demand import Demand
from moecache.replay import engine


def heldout_mask(sequences: list[str], last: int) -> np.ndarray:
    """Streams of the last `last` sequences, in order of first appearance (learned scorers
    train on the others)."""
    order = list(dict.fromkeys(sequences))
    held = set(order[len(order) - last :]) if last else set()
    return np.array([s in held for s in sequences])


def curve(demand: Demand, capacity: int, ks: list[int], heldout_last: int) -> dict:
    return curve_parts([demand], capacity, ks, heldout_last)


def curve_parts(
    parts, capacity: int, ks: list[int], heldout_last: int, replay=engine.replayed
) -> dict:
    """curve() over demand in parts (batches of whole streams, moecache.replay.stream),
    each part replayed under every rule before the next is read; `replay(part, rule,
    capacity)` gives a rule's counts (moecache.replay.batch serves union streams)."""
    kept, sequences, rules, causal = {}, [], None, []
    for demand in parts:
        if rules is None:
            causal = [
                r for r in engine.lossless_rules(demand) if r not in ("lru", "farthest-future")
            ]
            rules = {
                "lru": "lru",
                "oracle": "farthest-future",
                **{f"foresight-{k}": f"farthest-future:foresight={k}" for k in ks},
                **{r: r for r in causal},
            }
        for label, rule in rules.items():
            counts = replay(demand, rule, capacity)
            kept.setdefault(label, []).append(counts.after_fill)
        sequences += demand.sequences
    copies = {label: np.concatenate(runs) for label, runs in kept.items()}
    subsets = {
        "heldout": heldout_mask(sequences, heldout_last),
        "all": np.ones(len(sequences), bool),
    }
    out = {}
    for name, mask in subsets.items():
        total = {label: int(c[mask].sum()) for label, c in copies.items()}

        def share(label, total=total):
            return engine.gap_recovered(total["lru"], total["oracle"], total[label])

        out[name] = {
            "streams": int(mask.sum()),
            "copies": total,
            "foresight": [{"k": k, "gap_recovered": share(f"foresight-{k}")} for k in ks]
            + [{"k": None, "gap_recovered": share("oracle")}],  # unlimited
            "causal": {r: share(r) for r in causal},
        }
    return {
        "capacity": capacity,
        "heldout_sequences": heldout_last,
        "rules": rules,
        "subsets": out,
    }
