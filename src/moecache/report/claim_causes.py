"""A scorecard row's likely causes: where a claim differs and no experiment here tests why,
the causes its row states as such (`stated, not tested`), computed from the run's own config
(its results files' settings) and records."""

from __future__ import annotations

from moecache.records.io import read_run
from moecache.report.evidence import PAPER_MODEL, Missing, Results, runs_1x

# A cause the config does not show is left out (the paper's model at the paper's trace
# length: none).
PAPER_TRACE = (8, 16)  # the paper's trace: 8 layers x 16 sequences


def scale_cause(settings: dict) -> list[str]:
    source = settings["model"]["source"]
    if source == "embedded":
        return [f"model scale: a tiny model trained here, not {PAPER_MODEL}"]
    return [] if PAPER_MODEL in source else [f"model: {source}, not {PAPER_MODEL}"]


def trace_cause(settings: dict, results: Results | None) -> list[str]:
    layers = len(settings["harness"]["restricted_layers"])
    sequences = results.trace_sequences(settings) if results else None
    if sequences is None:
        return []
    if layers >= PAPER_TRACE[0] and sequences >= PAPER_TRACE[1]:
        return []
    return [f"the trace's length ({layers} layers x {sequences} sequences here)"]


def steps_cause(settings: dict, section: str, what: str) -> list[str]:
    steps = settings.get(section, {}).get("steps")
    return [] if steps is None else [f"{what} {steps} steps here ({section}.steps)"]


def copy_share_cause(results: Results) -> list[str]:
    """Copies a small share of a step (blocking 1x runs' mean): the runs lie close."""
    try:
        runs = [read_run(results.path(p)) for p in runs_1x(results)[1]]
    except Missing:
        return []
    shares = [run.totals.get("copy_share") for run in runs]
    if None in shares:
        return []
    share = sum(shares) / len(shares)
    if share >= 0.5:
        return []
    return [f"copies are {share:.0%} of a step on {runs[0].device_name}, so runs lie close"]


def causes(settings: dict | None, results: Results | None = None) -> dict[str, str]:
    """Claim key -> its likely causes under `settings` (none without settings)."""
    if settings is None:
        return {}
    scale = scale_cause(settings)
    found = {
        key: scale
        for key in (
            "restrict_cost",
            "foresight_16",
            "decayed_frequency",
            "dwell_window",
            "mean_interval_literal",
            "shuffled_control",
            "foresight_curve",
            "lfu_removes",
            "causal_rule",
        )
    }
    found["ff_vs_lru"] = scale + trace_cause(settings, results)
    # A property of the bound, whatever the config.
    found["ff_vs_bflat"] = ["B_flat's slack grows with k / C; the exact B* shows greedy's own gap"]
    found["cost_model_winner"] = copy_share_cause(results) if results else []
    found["learned_scorers"] = scale + steps_cause(settings, "learned", "the scorers train for")
    heads = steps_cause(settings, "controller", "the heads train for")
    found["controller_t50"] = found["controller_high"] = scale + heads
    found["router_copies"] = scale + steps_cause(settings, "router_tuning", "GRPO for")
    found["router_logit"] = scale + ["replayed here, closed loop in the paper"]
    tasks = settings.get("accuracy", {}).get("tasks", {})
    questions = sorted({t.get("questions") for t in tasks.values() if t.get("questions")})
    if questions:
        many = "/".join(map(str, questions))
        found["table2_order"] = [f"{many} questions a task here (accuracy.tasks)"]
    return {key: "; ".join(said) for key, said in found.items() if said}
