"""The sections of the later stages: the learned eviction scorers, router fine-tuning
(Table 3), the learned controller, multiple-choice accuracy (Table 2), and the runtime per
stage. Each renders the rows and verdicts its table builder returns as fields."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

from moecache.errors import MoecacheError
from moecache.records.io import read_dict
from moecache.records.learned import LearnedEvaluation
from moecache.report.numbers.format import (
    benchmark_times,
    count,
    duration,
    fixed,
    percent,
    table,
    yes,
)

# The runtime section's own benchmark is written after it: never counted.
OWN_BENCHMARK = "figures/numbers.tsv"


def learned_section(workdir: Path) -> str:
    """Each scorer's share of the LRU-to-oracle gap per shard (held-out sequences, all),
    in replay and closed loop, beside decayed frequency; then the best on held-out."""
    from moecache.report.verdicts.learned import learned_verdict, scorers

    path = workdir / "results/learned/evaluation.json"
    if not path.exists():
        return "No learned scorers in this run (the config has no `learned` section)."
    evaluation = read_dict(path, LearnedEvaluation)
    shards = list(evaluation["shards"])
    rows = [learned_row(evaluation, name) for name in scorers(evaluation)]
    header = ["rule", "features"] + [
        f"shard {s}, {subset}" for s in shards for subset in ("held out", "all")
    ]
    parts = (table(header, rows), learned_summary(evaluation, learned_verdict(evaluation)))
    study = workdir / "results/learned/causal.json"
    causal_part = causal_section(study) if study.exists() else ""
    check = workdir / "results/learned/causal-check.json"
    check_part = check_section(check) if check.exists() else ""
    return "\n\n".join(
        part for part in (*parts, dagger_line(evaluation), causal_part, check_part) if part
    )


def check_section(path: Path) -> str:
    """The causal rules' closed-loop check and cost per decision (report/causal.py), one
    line per rule."""
    from moecache.report import causal

    check = causal.read_check(path)
    rules = [rule for rule in check.cost["rules"] if rule != causal.REFERENCE_RULE]
    lines = [f"- {rule}: {causal.check_words(check, rule)}." for rule in rules]
    return "\n".join([causal.check_caption(check), "", *lines])


def causal_section(path: Path) -> str:
    """The causal rules' study (report/causal.py): each rule's share of the gap with its
    interval per shard and capacity, then the best rule and whether it meets the target."""
    from moecache.report import causal

    data = causal.frame(causal.read(path))
    keys = sorted({(r.trace, r.capacity) for r in data.itertuples()})
    rows = []
    for rule, part in data.groupby("rule", sort=False):
        by = {(r.trace, r.capacity): r for r in part.itertuples()}
        cells = [
            f"{percent(by[k].gap_heldout)} [{percent(by[k].gap_low)}, {percent(by[k].gap_high)}]"
            for k in keys
        ]
        rows.append([rule, part["params"].iloc[0], *cells])
    header = [
        "causal rule",
        "tuned on the training trace",
        *(f"shard {s}, C = {c}" for s, c in keys),
    ]
    study = causal.read(path)
    rule, texts, meets = causal.best_rule(study)
    verdict = (
        f"Causal rules tuned on the training trace only, measured on every sequence of each "
        f"shard (95% bootstrap intervals over sequences), which no choice read. Picked on the "
        f"training trace's {study.validation_sequences} validation sequences: {rule} "
        f"({percent(study.validation[rule])} of the gap there), {'; '.join(texts)}. "
        "Half of the gap at every capacity with the interval above the paper's 32.5%: "
        f"{yes(meets)}."
    )
    below, straddling = causal.target_calls(study)
    if straddling and not below:  # the scorecard's verdict: undecided, not holds
        verdict += f" Its interval straddles half at {'; '.join(straddling)}: undecided."
    return "\n\n".join((table(header, rows), verdict))


def learned_row(evaluation: dict, name: str) -> list[str]:
    """One scorer: its features, then per shard its held-out share (with the foresight it
    is worth and its closed-loop share) and its share on all sequences."""
    trained = evaluation["training"].get(name, {})
    cells = [name, trained.get("feature_set", "hand-built")]
    for result in evaluation["shards"].values():
        replay = result["replay"]
        if name not in replay["heldout"]:
            cells += ["", ""]
            continue
        loop = result["closed_loop"].get(name)
        closed = (
            f" (closed loop {percent(loop['heldout']['gap_recovered'])}, "
            f"equal {yes(loop['matches_replay'])})"
            if loop
            else ""
        )
        k = replay["heldout"][name]["foresight_equivalent"]
        share = replay["heldout"][name]["gap_recovered"]
        # Below the curve's first point (k = 1) a share is worth less than one token.
        worth = "" if share is None else ", k < 1" if k is None else f", k = {fixed(k, 1)}"
        cells += [
            f"{percent(share)}{worth}{closed}",
            f"{percent(replay['all'][name]['gap_recovered'])}",
        ]
    return cells


def learned_summary(evaluation: dict, verdict) -> str:
    """The verdict on the learned scorers (moecache.report.verdicts.learned) as one paragraph."""
    if not verdict.best:
        return ""
    decayed = ", ".join(
        f"{percent(r['replay']['heldout']['decayed-frequency']['gap_recovered'])} on {s}"
        for s, r in evaluation["shards"].items()
    )
    best = verdict.best
    return (
        f"Every learned scorer (controls aside) recovers more than decayed frequency on the "
        f"held-out sequences of its shards: {yes(verdict.beats_decayed)}. Half of the gap on "
        f"the held-out sequences of every shard: {yes(verdict.half_of_gap)}. "
        f"Best learned scorer on the held-out sequences of every shard: {best} "
        f"({evaluation['training'][best]['feature_set']} features), at least "
        f"{percent(verdict.worst[best])} of the gap on each; decayed frequency {decayed}."
    )


def dagger_line(evaluation: dict) -> str:
    """The MLP scorers' validation share per training round, when trained in rounds."""
    rounds = "; ".join(
        f"{name} " + ", ".join(percent(r["validation_gap_recovered"]) for r in trained["rounds"])
        for name, trained in evaluation["training"].items()
        if name.endswith("/mlp") and len(trained.get("rounds", [])) > 1
    )
    if not rounds:
        return ""
    return (
        "Share on the validation sequences by training round (first: the oracle's own "
        f"states only; then each DAgger round): {rounds}."
    )


def router_tuning_section(workdir: Path) -> str:
    """Table 3's copies per model beside the base, the logged and measured hit rates, and
    whether either explanation of the null result closes the gap (Table 3's own lines)."""
    from moecache.report import tables

    found = sorted((workdir / "results/router_tuning/measured").glob("*.json"))
    if not found:
        return "No router fine-tuning in this run (the config has no `router_tuning` section)."
    made = tables.table3(found)
    main, hits = made.parts[""], made.parts["simulated_vs_measured"].set_index("objective")
    base = main.iloc[0]
    rows = []
    for _, row in main.iterrows():
        hit = hits.loc[row["objective"]]
        logged = (
            f"{fixed(hit['logged_sim_hit_rate_start'], 3)} to "
            f"{fixed(hit['logged_sim_hit_rate_end'], 3)}"
            if not math.isnan(hit["logged_sim_hit_rate_start"])
            else ""
        )
        rows.append(
            (
                row["objective"],
                "not comparable" if math.isnan(row["base_nll"]) else fixed(row["base_nll"], 3),
                f"{count(row['lru'])} ({row['lru'] / base['lru'] - 1:+.1%})",
                count(row["lru_lfu_eviction"]),
                count(row["trained_layer"]),
                logged,
                fixed(hit["harness_hit_rate_heldout"], 3),
                fixed(hit["harness_hit_rate_own"], 3),
            )
        )
    header = (
        "objective",
        "NLL",
        "LRU copies (vs base)",
        "LRU+LFU eviction",
        "trained layer",
        "logged sim. hit rate",
        "harness hit rate, held out",
        "own generations",
    )
    steps = int(hits["steps"].max())
    return "\n\n".join([table(header, rows), f"{steps} steps per variant.", *made.verdict_lines()])


def controller_section(workdir: Path) -> str:
    """The appendix table's seed means per objective and threshold, the priced sweep, and
    its comparison and longer-sequence lines."""
    from moecache.report import tables

    sweep = sorted((workdir / "results/controller/sweep").glob("*-x*"))
    if not sweep:
        return "No learned controller in this run (the config has no `controller` section)."
    heads = sorted((workdir / "results/controller/heads").glob("*.safetensors"))
    longer = [workdir / "results/controller/longer"]
    made = tables.table_controller(sweep, [p for p in longer if p.is_dir()], heads)
    rows = controller_rows(made)
    header = (
        "objective / run",
        "threshold",
        "Delta NLL (± s.e. over seeds)",
        "copies/token",
        "tokens between refreshes",
        "heads' share of step (%)",
    )
    priced = made.parts["priced"]
    priced_rows = [
        (
            f"{r['price']:g}",
            f"{r['threshold']:g}",
            f"{r['delta_nll']:+.3f}",
            fixed(r["copies_per_token"], 2),
        )
        for _, r in priced.iterrows()
    ]
    lines = [*made.notes, *made.verdict_lines()]
    parts = [table(header, rows)]
    if priced_rows:
        parts += [
            "Priced (first objective and seed, traffic at e x tau):",
            table(("e (nats/ms)", "threshold", "Delta NLL", "copies/token"), priced_rows),
        ]
    return "\n\n".join([*parts, "\n".join(lines)])


def controller_rows(made) -> list[tuple[str, ...]]:
    """The controller table's rows: each objective and threshold's seed mean, then the
    simple runs it is compared with (the main part's rows without an objective)."""
    rows = []
    for _, row in made.parts["seeds"].iterrows():
        rows.append(
            (
                row["objective"],
                f"{row['threshold']:g}",
                f"{row['delta_nll']:+.3f} ± {fixed(row['delta_nll_se'], 3)}",
                fixed(row["copies_per_token"], 2),
                fixed(row["tokens_between_refreshes"], 1),
                fixed(row["heads_share_pct"], 1),
            )
        )
    main = made.parts[""]
    for _, row in main[main["objective"] == ""].iterrows():
        rows.append(
            (
                row["run"],
                "",
                f"{row['delta_nll']:+.3f}",
                fixed(row["copies_per_token"], 2),
                fixed(row["tokens_between_refreshes"], 1),
                "",
            )
        )
    return rows


def accuracy_section(workdir: Path) -> str:
    """Table 2 per task: each row's accuracy and retention with their intervals, the
    seeds' mean with its standard error, the measured switch rate; the tasks' lines."""
    from moecache.report import tables

    found = sorted((workdir / "results/accuracy").glob("*/summary.json"))
    if not found:
        return "No accuracy stage in this run (the config has no `accuracy` section)."
    made = tables.table2(found)

    def given(x) -> bool:
        return x is not None and not math.isnan(x)

    def retention(r) -> str:
        if given(r["retention_se"]):  # a mean over seeds
            return f"{100 * r['retention']:.1f}% ± {100 * r['retention_se']:.1f}"
        if not given(r["retention_lo"]):
            return f"{100 * r['retention']:.1f}%"
        lo, hi = 100 * r["retention_lo"], 100 * r["retention_hi"]
        return f"{100 * r['retention']:.1f}% ({lo:.1f}-{hi:.1f})"

    rows = [
        (
            r["task"],
            r["row"],
            f"{r['threshold']:g}" if given(r["threshold"]) else "",
            f"{r['accuracy']:.3f}"
            + (
                f" ({r['accuracy_lo']:.3f}-{r['accuracy_hi']:.3f})"
                if given(r["accuracy_lo"])
                else ""
            ),
            retention(r),
            f"{100 * r['switch_rate']:.1f}%",
            fixed(r["copies_per_token"], 2),
        )
        for _, r in made.parts[""].iterrows()
    ]
    header = (
        "task",
        "row",
        "threshold",
        "accuracy (95% interval)",
        "retention (interval, or ± s.e. over seeds)",
        "switch rate",
        "copies/token",
    )
    return "\n\n".join([table(header, rows), "\n".join(f"- {line}" for line in made.notes)])


# (family, test on the benchmark's path under benchmarks/), first match wins.
FAMILIES: list[tuple[str, Callable[[str], bool]]] = [
    (
        "corpus, tokenizer, held-out sequences, training",
        lambda p: p in ("corpus.tsv", "tokenizer.tsv", "train.tsv") or p.startswith("heldout/"),
    ),
    ("model profile", lambda p: p == "profile_model.tsv"),
    ("copy bandwidth", lambda p: p.startswith("bandwidth/")),
    ("link check", lambda p: p.startswith("link/")),
    ("gates", lambda p: p.startswith("gates/")),
    ("layer probe", lambda p: p.startswith("probe/")),
    ("decode", lambda p: p.startswith("decode/")),
    ("batched decoding", lambda p: p.startswith("batched/")),
    ("batched replay", lambda p: p.startswith("replay/") and "/batched/" in p),
    ("optimum sweep", lambda p: p == "replay/optimum-sweep.tsv"),
    ("replay benchmark", lambda p: p == "replay/benchmark.tsv"),
    ("replay, bounds, foresight", lambda p: p.startswith("replay/")),
    ("learned eviction", lambda p: p.startswith("learned/")),
    ("router fine-tuning", lambda p: p.startswith("router_tuning/")),
    ("learned controller", lambda p: p.startswith("controller/")),
    ("multiple-choice accuracy", lambda p: p.startswith("accuracy/")),
    ("tiers", lambda p: p.startswith("tiers/")),
    ("tables and figures", lambda p: p.startswith("figures/")),
    ("other", lambda p: True),
]


def runtime_section(workdir: Path) -> str:
    """Per stage, its jobs' wall-clock and CPU seconds summed over their Snakemake benchmarks
    (this section's own job excluded: it is written after); then the run's wall time, from
    the first job's start to the last one's end (each benchmark is written as its job ends:
    its file's time less its seconds), and the cores it had, so that a run on another
    machine, or with untimed jobs side by side, can be compared by CPU time."""
    root = workdir / "benchmarks"
    found = sorted(
        path.relative_to(root).as_posix()
        for path in root.rglob("*.tsv")
        if path.relative_to(root).as_posix() != OWN_BENCHMARK
    )
    if not found:
        raise MoecacheError(f"{root}: no benchmarks (run the pipeline)")
    times = {path: benchmark_times(root / path) for path in found}
    rows, total, cpu = [], 0.0, 0.0
    for family, member in FAMILIES:
        jobs = [path for path in found if member(path)]
        found = [path for path in found if path not in jobs]
        if not jobs:
            continue
        walls = [times[path][0] for path in jobs]
        cpus = [times[path][1] for path in jobs]
        total, cpu = total + sum(walls), cpu + sum(cpus)
        spread = f"{duration(min(walls))} to {duration(max(walls))}" if len(walls) > 1 else ""
        rows.append((family, str(len(jobs)), duration(sum(walls)), duration(sum(cpus)), spread))
    rows.append(("all jobs", str(len(times)), f"**{duration(total)}**", duration(cpu), ""))
    header = ("stage", "jobs", "time (sum of `benchmarks/`)", "CPU time", "per job")
    return "\n\n".join([table(header, rows), run_span(root, times)])


def run_span(root: Path, times: dict[str, tuple[float, float]]) -> str:
    """One line: the run's wall time (first start to last end), its jobs' CPU time, and the
    cores of the machine the report was made on (the run's)."""
    ends = {path: (root / path).stat().st_mtime for path in times}
    wall = max(ends.values()) - min(ends[path] - times[path][0] for path in times)
    cpu = sum(cpu for _, cpu in times.values())
    cores = len(os.sched_getaffinity(0))
    return (
        f"The run: {duration(wall)} of wall time from its first job's start to its last "
        f"job's end, {duration(cpu)} of the jobs' CPU time, on {cores} cores."
    )
