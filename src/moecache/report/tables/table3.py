"""Table 3: steady transfers of routers fine-tuned for cache hits, and whether either
explanation of the null result closes the gap (decided in
moecache.report.verdicts.router_tuning)."""

from __future__ import annotations

import pandas as pd

from moecache.errors import MoecacheError
from moecache.records.io import read_dict
from moecache.records.router_tuning import TunedModel
from moecache.report.tables.base import Table, not_produced
from moecache.report.verdicts.router_tuning import GapVerdict, gap_verdicts

ROUTER_OBJECTIVES = {
    "base": "Base (untuned)",
    "sft": "SFT control",
    "hit": "Cache-hit reward",
    "tag": "+ cache-size tag",
    "harness": "Harness-copies reward (all layers, teacher-forced)",
}


TITLE = "Table 3. Steady transfers of routers fine-tuned for cache hits"
COLUMNS = ["objective", "base_nll", "lru", "lru_lfu_eviction", "trained_layer"]


def table3(router=()) -> Table:
    """Steady copies per model (moecache router-measure results), on held-out text and on
    each model's own continuations; the simulated hit rate training logged beside the
    harness's; whether either explanation of the null result closes the gap."""
    if not router:
        return not_produced(
            "table3",
            TITLE,
            "needs the router fine-tuning runs (config section router_tuning)",
            COLUMNS,
        )
    measured = [read_dict(path, TunedModel) for path in router]
    found = {m["model"]: m for m in measured}
    if "base" not in found:
        raise MoecacheError("table3: no measurement of the untuned base among --router")
    base = found["base"]
    tuning = base["settings"]["router_tuning"]
    layer, capacity = tuning["layer"], tuning["capacity"]
    tag_nll = found["tag"]["teacher_forced"]["nll"] if "tag" in found else None
    notes = [
        f"Trained layer: layer {layer} alone at C={capacity}, the LRU run's routing at that "
        "layer replayed through the same LRU. "
        + (
            f"The tagged variant's NLL ({tag_nll:.4f}) is not comparable: its tag tokens are "
            "scored too."
            if tag_nll is not None
            else ""
        ),
    ]
    return Table(
        "table3",
        TITLE,
        "Steady expert copies (lower is better) on the first "
        f"{base['teacher_forced']['sequences']} held-out sequences of the first shard, "
        "teacher-forced: under lossless LRU, under lossless decayed-frequency (LFU) "
        "eviction, and at the training setting. NLL: the model's own next-token NLL "
        "(lossless serving keeps it).",
        {
            "": copies(found, "teacher_forced", "base_nll"),
            "own_generations": copies(found, "own_generations", "own_text_nll"),
            "simulated_vs_measured": hit_rates(found),
        },
        list(router),
        notes,
        part_captions(base, layer, capacity),
        verdicts={"": [verdict_line(v) for v in gap_verdicts(found)]},
    )


def part_captions(base: dict, layer: int, capacity: int) -> dict[str, str]:
    """The captions of Table 3's parts after its first: the counts on the models' own
    generations, and the simulated hit rates beside the harness's."""
    return {
        "own_generations": (
            f"The same counts on each model's own greedy continuations of the first "
            f"{base['own_generations']['sequences']} sequences' starts (explanation one: "
            "the reward sees the model's own generations). NLL there is the model's NLL "
            "on its own text."
        ),
        "simulated_vs_measured": (
            f"Hit rate of a {capacity}-slot LRU at layer {layer}: the training log's "
            "(mean of the first and last quarter of the steps, sampled generations), the "
            "same simulator on greedy continuations of training prompts before and after "
            "training, and the harness's on held-out text and on the model's own "
            "continuations (sim_hit_rate_own: the reward's definition, continuation "
            "tokens only)."
        ),
    }


def models_of(found: dict) -> list[str]:
    return [name for name in ROUTER_OBJECTIVES if name in found]


def copies(found: dict, text: str, nll: str) -> pd.DataFrame:
    """Steady copies per model on `text` (teacher_forced or own_generations)."""
    return pd.DataFrame(
        [
            {
                "objective": ROUTER_OBJECTIVES[name],
                nll: r[text]["nll"] if r["nll_comparable"] else None,
                "lru": r[text]["lru_steady"],
                "lru_lfu_eviction": r[text]["decayed_frequency_steady"],
                "trained_layer": r[text]["trained_layer_steady"],
            }
            for name, r in ((n, found[n]) for n in models_of(found))
        ],
        columns=[nll if c == "base_nll" else c for c in COLUMNS],
    )


def hit_rates(found: dict) -> pd.DataFrame:
    """Per model: the simulated hit rate its training logged beside the harness's."""
    rows = []
    for name in models_of(found):
        r, training = found[name], found[name]["training"] or {}
        logged = training.get("log_sim_hit_rate") or {}
        greedy = training.get("greedy_sim_hit_rate") or {}
        rows.append(
            {
                "objective": ROUTER_OBJECTIVES[name],
                "steps": training.get("steps"),
                "logged_sim_hit_rate_start": logged.get("start"),
                "logged_sim_hit_rate_end": logged.get("end"),
                "greedy_sim_hit_rate_start": greedy.get("start"),
                "greedy_sim_hit_rate_end": greedy.get("end"),
                "harness_hit_rate_heldout": r["teacher_forced"]["trained_layer_hit_rate"],
                "harness_hit_rate_own": r["own_generations"]["trained_layer_hit_rate"],
                "sim_hit_rate_own": r["own_generations"]["sim_hit_rate"],
            }
        )
    return pd.DataFrame(rows)


def verdict_line(v: GapVerdict) -> str:
    """One variant's verdict as Table 3 states it."""
    label = ROUTER_OBJECTIVES[v.model].removeprefix("+ ").capitalize()  # no Markdown bullet
    line = (
        f"{label}: logged simulated hit rate {v.simulated:+.3f}; harness "
        f"hit rate at the trained layer against the base {v.held:+.3f} on held-out text, "
        f"{v.own:+.3f} on its own generations ({v.against}: {v.own_ref:+.3f}); LRU copies "
        f"{v.lru:+.1%} against the base ({v.against}: {v.lru_ref:+.1%})."
    )
    if v.model == "harness":
        line += f" Its logged copies per token (its reward) changed {v.logged_copies:+.1%}; "
        if v.closes is None:
            return line + "the log shows no fall, so there is no gap to close."
        return line + (
            f"the measured change beyond {v.against} reaches half of that: {yes(v.closes)}."
        )
    if v.closes is None:
        return line + " The log shows no simulated gain, so there is no gap to close."
    return line + (
        f" Measured on its own generations, its gain beyond {v.against} reaches half "
        f"the simulated gain: {yes(v.closes)}."
    )


def yes(flag: bool) -> str:
    return "yes" if flag else "no"
