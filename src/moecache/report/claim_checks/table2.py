"""Table 2's claim: the fixed-set accuracy order, with whether free routing answers above
chance and which pairs the questions tell apart."""

from __future__ import annotations

from pathlib import PurePosixPath

import numpy as np

from moecache.intervals import paired_difference
from moecache.records.accuracy import AccuracySummary
from moecache.records.io import read_dict
from moecache.report.evidence import UNDECIDED, Found, Missing, Results, joined, judged
from moecache.report.power import about, pairs_to_tell_apart, questions_to_clear

TABLE2_ORDER = ("free", "oracle-set", "recent-use")
# Table 2's order pair by pair: (higher, lower, strictly, the paper's gap between them),
# from 0.484 >= 0.481 > 0.430 > 0.413 (App. §8); "learned" is the matched seeds' mean.
TABLE2_PAIRS = (
    ("free", "oracle-set", False, 0.003),
    ("oracle-set", "recent-use", True, 0.051),
    ("recent-use", "learned", True, 0.017),
)


def table2_order(r: Results) -> Found:
    """Holds when each strict pair of Table 2's order is told apart in its direction (a
    paired 95% interval over the questions above 0) and no pair is told apart against it;
    differs when one is; undecided where free routing does not answer above chance or a
    strict pair is not told apart, with the questions that would decide it."""
    paths = r.glob("results/accuracy/*/summary.json", "accuracy summaries")
    summaries = {p: read_dict(r.path(p), AccuracySummary) for p in paths}
    chosen = table2_task(summaries)
    summary = summaries[chosen]
    accuracy = {row["row"]: row["accuracy"] for row in summary["rows"]}
    learned = [v for k, v in accuracy.items() if k.endswith("-matched")]
    if not learned or any(name not in accuracy for name in TABLE2_ORDER):
        raise Missing(f"a Table 2 row is missing from {chosen}")
    order = [accuracy[name] for name in TABLE2_ORDER] + [sum(learned) / len(learned)]
    value = " >= ".join(f"{a:.3f}" for a in order) + " (free, oracle, recent, learned)"
    task = summary["task"].removeprefix("moecache_")
    setting = f"task {task}, {summary['questions']} questions"
    premise = above_chance_words(summary)
    if premise:
        return Found(value, UNDECIDED, setting, premise, [chosen])
    answers = str(PurePosixPath(chosen).with_name("questions.parquet"))
    correct = question_answers(r, answers)
    seed = (summary.get("settings") or {}).get("seed", 0)
    calls = [pair_call(correct, pair, seed) for pair in TABLE2_PAIRS]
    against = [said for call, said in calls if call is False]
    too_small = "" if against else joined(*(said for call, said in calls if call is None))
    ok = not against
    return Found(
        value, judged(ok, "", too_small), setting, joined(*against, too_small), [chosen, answers]
    )


def free_row(summary: dict) -> dict:
    return next(row for row in summary["rows"] if row["row"] == "free")


def table2_task(summaries: dict[str, dict]) -> str:
    """The task the claim reads: the first (MMLU first, the paper's) whose free routing
    answers above chance, else MMLU's or the first."""
    paths = sorted(summaries, key=lambda p: "/mmlu/" not in p)
    above = [p for p in paths if not above_chance_words(summaries[p])]
    return (above or paths)[0]


def above_chance_words(summary: dict) -> str:
    """Why free routing's answers cannot order Table 2 ('' where its 95% interval lies
    above chance), with the questions that would lift it clear at its accuracy."""
    free = free_row(summary)
    low, high = free["accuracy_ci"]
    chance = summary["chance"]
    if low > chance:
        return ""
    n = questions_to_clear(free["accuracy"], chance)
    size = (
        f"{about(n)} questions would clear chance at this accuracy"
        if n
        else "score a task it answers above chance"
    )
    return (
        f"free routing does not answer above chance ({free['accuracy']:.3f} [{low:.3f}, "
        f"{high:.3f}] on {summary['questions']} questions, chance {chance:.3f}): "
        f"{size} (accuracy.tasks)"
    )


def question_answers(r: Results, relative: str) -> dict[str, np.ndarray]:
    """Each Table 2 row's correctness per question (in free routing's order of the
    questions), the matched learned seeds averaged into `learned`."""
    import pandas as pd

    if not (r.workdir / relative).exists():
        raise Missing(f"no per-question answers ({relative})")
    frame = pd.read_parquet(r.path(relative), columns=["row", "question", "correct"])
    table = frame.pivot(index="question", columns="row", values="correct").astype(float)
    table = table.loc[frame.loc[frame["row"] == "free", "question"]]
    found = {name: table[name].to_numpy() for name in TABLE2_ORDER}
    matched = [name for name in table.columns if name.endswith("-matched")]
    found["learned"] = table[matched].mean(axis=1).to_numpy()
    return found


def pair_call(correct: dict, pair: tuple, seed: int) -> tuple[bool | None, str]:
    """One pair of Table 2's order on the same questions: False with why where the paired
    interval puts the lower row above, True where it puts the higher above (or, for >=,
    not below), None with the questions that would tell them apart otherwise."""
    higher, lower, strictly, paper_gap = pair
    a, b = correct[higher], correct[lower]
    ones = np.ones_like(a)
    point, (low, high) = paired_difference(a, ones, b, ones, seed)
    shown = f"{higher} - {lower} {point:+.3f} [{low:+.3f}, {high:+.3f}]"
    if high < 0:
        return False, f"{shown}: {lower} above {higher} by its whole interval"
    if low > 0 or not strictly:
        return True, ""
    # A difference on the claim's side decides at its own size; none, at the paper's.
    gap = point if point > 0 else paper_gap
    diffs = a - b
    scatter = float(np.std(diffs, ddof=1)) if len(diffs) > 1 else 0.0
    if scatter == 0:  # every question alike: the scatter of two independent rows
        scatter = float(np.sqrt(a.mean() * (1 - a.mean()) + b.mean() * (1 - b.mean())))
    n = pairs_to_tell_apart(scatter, gap)
    return None, f"{shown}: {about(n)} questions would tell apart a gap of {gap:.3f}"
