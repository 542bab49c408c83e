"""Causal eviction rules, tuned on the training trace and measured on the shards' traces at
every capacity of learned.causal.capacities.

The training trace is split as the learned scorers split it (learned/stage.py split): its
last learned.validation_sequences.trace sequences validate, the rest fit. Each rule of
learned.causal.grids is replayed on the fitting sequences at every capacity for every point
of its grid; the point with the highest mean share of the LRU-to-farthest-future gap there
is kept. The next-use model is fitted on the fitting sequences for every horizon of
learned.causal.next_use.horizons, with and without standardised inputs as
learned.causal.next_use.standardise lists; the variant and its rule weights are chosen on
the validation sequences, and so is the study's pick, the rule with the highest mean share
there. Its shuffled-label control is fitted with the chosen variant and replayed with the
chosen weights. Then every kept rule, the model and the control are replayed on every
sequence of each shard's trace, read only to report (no choice was made on them), with a
percentile bootstrap interval of the share over sequences, seeded from the config.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from moecache.intervals import bootstrap_ratio
from moecache.learned import next_use
from moecache.learned.stage import by_sequence, split
from moecache.records.causal import CONTROL, CausalStudy
from moecache.records.demand import Demand, subset
from moecache.replay import engine

NEXT_USE = "next-use"


def rule_text(name: str, params: dict) -> str:
    return name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")


def copies(demand: Demand, text: str, capacity: int) -> dict[str, int]:
    """Copies per sequence of rule `text`; the next-use rule replays each layer's streams
    with that layer's model (its layers summed per sequence)."""
    name, params = engine.parse_rule(text)
    if name != NEXT_USE or "layer" in params:
        return replayed(demand, text, capacity)
    total: dict[str, int] = {}
    for layer, streams in next_use.layer_ids(demand).items():
        part = replayed(
            subset(demand, streams), rule_text(name, {**params, "layer": layer}), capacity
        )
        for sequence, n in part.items():
            total[sequence] = total.get(sequence, 0) + n
    return total


def replayed(demand: Demand, text: str, capacity: int) -> dict[str, int]:
    """Copies per sequence of rule `text` over all of `demand`."""
    return by_sequence(
        demand, engine.run(demand, engine.make_rule(text, demand, capacity)).insertions
    )


def share(lru: dict, oracle: dict, rule: dict, sequences) -> float:
    total = {
        name: sum(c[s] for s in sequences) for name, c in (("l", lru), ("o", oracle), ("r", rule))
    }
    return engine.gap_recovered(total["l"], total["o"], total["r"])


def grid_points(grid: dict) -> list[dict]:
    """Every combination of a grid's values, in the config's order."""
    names = list(grid)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*grid.values())]


class Training:
    """The training trace with LRU's and the oracle's copies at each capacity, for tuning."""

    def __init__(self, demand: Demand, capacities: list[int]):
        self.demand, self.capacities = demand, capacities
        self.ends = {
            c: (copies(demand, "lru", c), copies(demand, "farthest-future", c)) for c in capacities
        }

    def mean_share(self, text: str) -> float:
        sequences = set(self.demand.sequences)
        return float(
            np.mean(
                [
                    share(*self.ends[c], copies(self.demand, text, c), sequences)
                    for c in self.capacities
                ]
            )
        )

    def choose(self, name: str, grid: dict) -> tuple[dict, list]:
        """The grid's point with the highest mean share (the first on ties), and every point's."""
        tried = [
            {"params": p, "share": self.mean_share(rule_text(name, p))} for p in grid_points(grid)
        ]
        best = max(range(len(tried)), key=lambda i: (tried[i]["share"], -i))
        return tried[best]["params"], tried


def fit_next_use(
    training: Training, validation: Training, settings, out_dir: Path, published: Path
) -> tuple[dict, dict]:
    """The chosen model's rule parameters and the control's, and both fits' summaries (their
    weights named in `published`, the folder `out_dir` becomes): every variant fitted on
    `training`, the variant and its weights chosen on `validation`."""
    spec, seed = settings["learned"]["causal"]["next_use"], settings["seed"]
    fit_args = (spec["steps"], spec["lr"], spec["l2"], seed)
    best, tried = None, []
    for horizon, standardise in itertools.product(spec["horizons"], spec["standardise"]):
        model, summary = next_use.fit(training.demand, horizon, *fit_args, standardise=standardise)
        path = out_dir / f"next-use-h{horizon}{'' if standardise else '-raw'}.safetensors"
        next_use.save(model, path, summary)
        grid = {"weights": [str(path)], "frequency": spec["frequency"]}
        params, points = validation.choose(NEXT_USE, {**grid, "coactivation": spec["coactivation"]})
        tried += [{**p, "horizon": horizon, "standardise": standardise} for p in points]
        score = max(p["share"] for p in points)
        if best is None or score > best[0]:
            best = (score, params, summary)
    _, params, summary = best
    control, control_summary = next_use.fit(
        training.demand,
        summary["horizon"],
        *fit_args,
        permute=True,
        standardise=summary["standardise"],
    )
    control_path = out_dir / f"next-use{CONTROL}.safetensors"
    next_use.save(control, control_path, control_summary)
    rules = {NEXT_USE: params, NEXT_USE + CONTROL: {**params, "weights": str(control_path)}}
    about = {
        "model": summary,
        "control": control_summary,
        "tried": [{**p, "params": named_in(p["params"], published)} for p in tried],
        "chosen": named_in(params, published),
    }
    return rules, about


def named_in(params: dict, folder: Path) -> dict:
    """`params` with its weights file named in `folder`."""
    return {**params, "weights": str(folder / Path(params["weights"]).name)}


def measured(demand: Demand, rules: dict, capacity: int, seed: int) -> dict:
    """Every rule's copies, share and interval over `demand`'s sequences at `capacity`."""
    lru, oracle = copies(demand, "lru", capacity), copies(demand, "farthest-future", capacity)
    sequences = list(lru)
    gap = [lru[s] - oracle[s] for s in sequences]
    out = {}
    for label, (name, params) in {
        "lru": ("lru", {}),
        "farthest-future": ("farthest-future", {}),
        **rules,
    }.items():
        mine = copies(demand, rule_text(name, params), capacity)
        saved = [lru[s] - mine[s] for s in sequences]
        out[label] = {
            "copies": int(sum(mine.values())),
            "share": share(lru, oracle, mine, sequences),
            "interval": bootstrap_ratio(saved, gap, seed),
        }
    return {"sequences": sequences, "rules": out}


def study(
    settings, training_demand: Demand, shards: dict[str, Demand], out_dir, published=None
) -> CausalStudy:
    """Tune, fit and measure every causal rule (the module docstring). The models are written
    to `out_dir`; the study names them in `published` (default `out_dir`), the folder
    `out_dir` is moved to when the command succeeds."""
    causal, seed = settings["learned"]["causal"], settings["seed"]
    capacities = list(causal["capacities"])
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    held_apart = settings["learned"]["validation_sequences"]["trace"]
    fitting, validating = split(training_demand, 0, held_apart)
    training = Training(subset(training_demand, fitting), capacities)
    validation = Training(subset(training_demand, validating), capacities)
    tuning, rules = {}, {}
    for name, grid in causal["grids"].items():
        chosen, tried = training.choose(name, grid)
        tuning[name] = {"grid": tried, "chosen": chosen}
        rules[name] = (name, chosen)
    fitted, about = fit_next_use(
        training, validation, settings, out_dir, Path(published or out_dir)
    )
    rules.update({label: (NEXT_USE, params) for label, params in fitted.items()})
    picked = {
        label: validation.mean_share(rule_text(*rule))
        for label, rule in rules.items()
        if not label.endswith(CONTROL)
    }
    results = {
        shard: {str(c): measured(demand, rules, c, seed) for c in capacities}
        for shard, demand in shards.items()
    }
    return CausalStudy(
        seed=seed,
        capacities=capacities,
        training_sequences=len(set(training.demand.sequences)),
        validation_sequences=len(set(validation.demand.sequences)),
        validation=picked,
        chosen=max(picked, key=picked.get),  # the first of equals, in the config's order
        tuning=tuning,
        next_use=about,
        shards=results,
    )
