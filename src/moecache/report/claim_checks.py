"""One function per claim of the paper: each reads its results files through `Results`
and answers with this run's value, the setting, the verdict and the files (`Found`), or
raises `Missing`. The tolerances are the verdicts' own; claims.CLAIMS states them. Where
the run's own evidence cannot decide a claim (a premise fails, or an interval straddles the
tolerance), the verdict is `undecided` and `why` says why, with the size that would decide
it (evidence.py's power section computes those sizes)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath

import numpy as np

from moecache.intervals import paired_difference
from moecache.records.accuracy import AccuracySummary
from moecache.records.controller import HeadsLog
from moecache.records.io import read_dict, read_run
from moecache.records.learned import LearnedEvaluation
from moecache.records.replay import OptimumSweep
from moecache.records.router_tuning import TunedModel, TuningLog
from moecache.report.evidence import (
    DIFFERS,
    PAPER_RATIO,
    PLATEAU_SHARE,
    UNDECIDED,
    Found,
    Missing,
    Plateau,
    Results,
    Trend,
    about,
    at_capacity,
    joined,
    judged,
    model_why,
    near,
    pairs_to_tell_apart,
    pct,
    questions_to_clear,
    runs_1x,
    size_to_clear,
    steps_to_show,
    verdict,
    whole,
)
from moecache.report.verdicts.router_tuning import LEARNED_SERIES, SERIES_WORDS, learned_trend
from moecache.runs import HeadsName, RunName, at_multiplier

# ------------------------------------------------------------------------ replay claims


def replay_claim(name: str, measure: Callable[[dict], tuple[float, str]], ok):
    """A claim on one replay file (`name`: replay, bound, foresight): `measure` gives the
    number the verdict tests with `ok` and the text the row shows, at the paper's C and,
    for the record, at every other capacity replayed on the same shard."""

    def claim(r: Results) -> Found:
        report, path, paper = r.replay(name)
        number, shown = measure(report)
        setting, why = at_capacity(report, paper, path)
        found = Found(shown, judged(ok(number), why), setting, why, [path])
        for capacity, other, other_path in r.others(name, path):
            try:
                found.elsewhere.append(f"C = {capacity}: {measure(other)[1]}")
                found.sources.append(other_path)
            except Missing:
                continue
        return found

    return claim


def rule_totals(report: dict, rule: str) -> tuple[dict, dict]:
    if rule not in report["rules"]:
        raise Missing(f"rule {rule} was not replayed at C = {report['capacity']}")
    return report["rules"][rule]["totals"], report["rules"]["lru"]["totals"]


def fewer_copies(report: dict) -> tuple[float, str]:
    ff, lru = rule_totals(report, "farthest-future")
    ratio = lru["after_fill"] / ff["after_fill"]
    return ratio, f"{ratio:.2f}x ({lru['after_fill']:,} -> {ff['after_fill']:,})"


def bflat_gap(report: dict) -> tuple[float, str]:
    t = report["totals"]
    return t["gap"], f"{pct(t['gap'])} (B_flat {t['b_flat']:,}, B_greedy {t['b_greedy']:,})"


def bstar_gap(report: dict) -> tuple[float, str]:
    t = report["totals"]
    return t["greedy_gap"], f"{pct(t['greedy_gap'])} (B* {t['b_star']:,} by the LP)"


def foresight_points(report: dict) -> dict:
    subset = "heldout" if report["subsets"]["heldout"]["streams"] else "all"
    return {p["k"]: p["gap_recovered"] for p in report["subsets"][subset]["foresight"]}


def sixteen_tokens(report: dict) -> tuple[float, str]:
    points = foresight_points(report)
    if points.get(16) is None:
        raise Missing(f"no foresight k = 16 at C = {report['capacity']} (replay.foresight)")
    return points[16], pct(points[16])


FORESIGHT_CURVE = {1: 0.17, 2: 0.31, 4: 0.51, 8: 0.76, 16: 0.96, 32: 0.997}


def curve_distance(report: dict) -> tuple[float, str]:
    """The largest distance from the paper's curve over the k both have."""
    points = foresight_points(report)
    ks = [k for k in FORESIGHT_CURVE if points.get(k) is not None]
    if not ks:
        raise Missing(f"no foresight at k = 1, 2, 4, 8, 16 or 32 at C = {report['capacity']}")
    shown = "/".join(f"{100 * points[k]:.0f}" for k in ks) + f"% at k = {', '.join(map(str, ks))}"
    return max(abs(points[k] - FORESIGHT_CURVE[k]) for k in ks), shown


def share_of(rule: str) -> Callable[[dict], tuple[float, str]]:
    def measure(report: dict) -> tuple[float, str]:
        share = rule_totals(report, rule)[0]["gap_recovered"]
        if share is None:
            raise Missing(f"no LRU-to-oracle gap at C = {report['capacity']}")
        return share, pct(share)

    return measure


def more_than_lru(report: dict) -> tuple[float, str]:
    rule, lru = rule_totals(report, "router-logit")
    more = rule["after_fill"] / lru["after_fill"] - 1
    return more, f"{more:+.1%} against LRU (replayed)"


ff_vs_lru = replay_claim("replay", fewer_copies, lambda x: near(x / 2.1, 1, 0.10))
ff_vs_bflat = replay_claim("bound", bflat_gap, lambda x: near(x, 0, 0.045))
ff_vs_bstar = replay_claim("bound", bstar_gap, lambda x: near(x, 0, 0.035))
foresight_16 = replay_claim("foresight", sixteen_tokens, lambda x: near(x, 0.96, 0.05))
foresight_curve = replay_claim("foresight", curve_distance, lambda x: near(x, 0, 0.10))
router_logit = replay_claim("replay", more_than_lru, lambda x: near(x, 0.46, 0.10))


def gap_share(rule: str, paper: float) -> Callable[[Results], Found]:
    """A rule's share of the LRU-to-oracle gap, within 5 points of the paper's."""
    return replay_claim("replay", share_of(rule), lambda x: near(x, paper, 0.05))


# ------------------------------------------------------------------------ other claims


def restrict_cost(r: Results) -> Found:
    points, paths = runs_1x(r)  # blocking: the paper's runs wait for their copies
    lru = next((p for p in points if p.policy == "lru"), None)
    if lru is None:
        raise Missing("no lru run at 1x")
    faster = [p for p in points if p.restricts and p.tokens_per_second > lru.tokens_per_second]
    if not faster:
        return Found("none faster than LRU", DIFFERS, "1x", "", paths)
    cheapest = min(faster, key=lambda p: p.delta_nll)
    value = f"{cheapest.delta_nll:+.3f} ({cheapest.run}; {len(faster)} faster than LRU)"
    why = model_why(r, paths)
    ok = cheapest.delta_nll >= 0.067 - 1e-9
    if why:  # the direction still compares: does every faster one lose quality?
        loses = "yes" if cheapest.delta_nll > 0 else "no"
        why += f"; every faster restricting run loses quality: {loses}"
    return Found(value, judged(ok, why), "1x, first shard", why, paths)


def cost_model_winner(r: Results) -> Found:
    from moecache.report import tables

    _, runs = runs_1x(r)  # equation (1) prices blocking copies: blocking runs only
    scaled = r.glob(f"results/runs/{r.shards[0]}/*.json", "runs")
    scaled = [p for p in scaled if RunName.of(p).multiplier > 1]
    scaled = [p for p in scaled if read_run(r.path(p)).blocking]
    bandwidth = r.glob("results/bandwidth/*.json", "bandwidth file")[:1]
    if not scaled:
        raise Missing("no run repeated at a copy multiplier")
    full = [r.path(p) for p in (*runs, *scaled, *bandwidth)]
    part = tables.cost_model_part(full[: len(runs)], full[len(runs) : -1], full[-1:])
    found = {int(c["multiplier"]): c for c in part.checks if c.get("measured_winner")}
    wanted = [m for m in (10, 50) if m in found]
    if not wanted:
        raise Missing("no winner check at 10x or 50x")
    timed = {(int(row["multiplier"]), row["run"]): row for row in part.rows}
    calls = {m: winner_call(found[m], timed, m) for m in wanted}
    value = "; ".join(winner_text(m, found[m]) for m in wanted)
    why = "" if len(wanted) == 2 else f"runs repeated at {wanted[0]}x only"
    sequences = len(read_run(r.path(scaled[0])).sequences_decoded)
    too_small = ""
    if False not in calls.values():  # a wrong pick told apart decides, whatever the rest
        too_small = joined(
            *(winner_power(m, found[m], timed, sequences) for m in wanted if calls[m] is None)
        )
    ok = all(calls.values())
    found_verdict = judged(ok, why, too_small)
    return Found(
        value, found_verdict, "10x and 50x", joined(why, too_small), [*runs, *scaled, *bandwidth]
    )


def winner_pair(check: dict) -> tuple[str, str]:
    """The two runs whose order decides the check: the measured winner and the runner-up
    where equation (1) picked the winner, else the pick and the measured winner."""
    if check["predicted_winner"] == check["measured_winner"]:
        return check["measured_winner"], check["runner_up"]
    return check["measured_winner"], check["predicted_winner"]


def winner_call(check: dict, timed: dict, multiplier: int) -> bool | None:
    """Whether equation (1) picked the measured winner, where the measurement can rank the
    two runs that decide it (their 95% intervals apart); None where it cannot."""
    first, other = (timed[(multiplier, run)] for run in winner_pair(check))
    apart = first["measured_ms_hi"] < other["measured_ms_lo"]
    if not apart:
        return None
    return check["predicted_winner"] == check["measured_winner"]


def winner_power(multiplier: int, check: dict, timed: dict, sequences: int) -> str:
    """Why the measurement cannot rank the two runs, and the sequences that would: an
    interval narrows as one over the root of the sequences timed."""
    rows = [timed[(multiplier, run)] for run in winner_pair(check)]
    halves = sum((row["measured_ms_hi"] - row["measured_ms_lo"]) / 2 for row in rows)
    gap = abs(rows[1]["measured_ms"] - rows[0]["measured_ms"])
    size = None if gap == 0 else whole(sequences * (halves / gap) ** 2)
    spans = " and ".join(
        f"{row['run']} {row['measured_ms_lo']:.2f}-{row['measured_ms_hi']:.2f}" for row in rows
    )
    return (
        f"at {multiplier}x the measurement cannot rank {rows[0]['run']} and {rows[1]['run']} "
        f"(95% intervals {spans} ms a token, {sequences} sequences): {about(size)} sequences "
        "would at this difference (harness.scaled_sequences)"
    )


def winner_text(multiplier: int, check: dict) -> str:
    text = (
        f"{multiplier}x: predicted {check['predicted_winner']}, measured {check['measured_winner']}"
    )
    if not check["told_apart"]:
        text += f" (not told apart from {check['runner_up']})"
    return text


def learned_rows(r: Results) -> tuple[dict, int, str, str]:
    evaluation, path = r.read(
        "results/learned/evaluation.json", "learned evaluation", LearnedEvaluation
    )
    shard = next((s for s in r.shards if s in evaluation["shards"]), None)
    if shard is None:
        raise Missing(f"no shard evaluated in {path}")
    heldout = evaluation["shards"][shard]["replay"]["heldout"]
    return heldout, evaluation["capacity"], f"C = {evaluation['capacity']}, shard {shard}", path


def learned_scorers(r: Results) -> Found:
    heldout, capacity, setting, path = learned_rows(r)
    router = {
        n: v["gap_recovered"]
        for n, v in heldout.items()
        if n.startswith("router/") and not n.endswith("-permuted")
    }
    if not router:
        raise Missing(f"no router-feature scorer in {path}")
    best = max(sorted(router), key=router.get)
    replay, _, _ = r.replay("replay")
    why = (
        ""
        if capacity == PAPER_RATIO * replay["experts"]
        else (f"scorers trained and evaluated at the harness's C = {capacity} only")
    )
    value = f"{pct(router[best])} ({best}, held out)"
    return Found(value, judged(near(router[best], 0.325, 0.05), why), setting, why, [path])


def causal_rule(r: Results) -> Found:
    """The best causal rule of the causal study (report/causal.py), at every capacity and
    shard; holds when its interval lies above half the gap everywhere, differs when it lies
    below half anywhere, and is undecided where an interval straddles half."""
    from moecache.report import causal

    relative = "results/learned/causal.json"
    if not (r.workdir / relative).exists():
        raise Missing(f"no causal rules' study ({relative})")
    study = causal.read(r.path(relative))
    rule, texts, _ = causal.best_rule(study)
    below, straddling = causal.target_calls(study)
    too_small = ""
    if straddling and not below:
        too_small = (
            "the interval straddles half of the gap at "
            + "; ".join(straddling)
            + ": a shard of that many sequences would decide it (corpus.heldout.sequences)"
        )
    shown = len(study.capacities)  # the first shard at every capacity; the others beside
    capacities = ", ".join(map(str, study.capacities))
    found = Found(
        f"{'; '.join(texts[:shown])} ({rule})",
        judged(not below, "", too_small),
        f"C = {capacities}, every sequence",
        too_small,
        [relative],
    )
    found.elsewhere.extend(texts[shown:])
    checked = "results/learned/causal-check.json"
    if (r.workdir / checked).exists():
        check = causal.read_check(r.path(checked))
        if rule in check.cost["rules"]:
            found.why = joined(found.why, causal.check_words(check, rule))
            found.sources.append(checked)
    return found


def tiers_lead(r: Results) -> Found:
    """Farthest-future against LRU over two tiers (report/verdicts/tiers.py): the share of
    ms per token it saves in every cell of the grid; holds when it costs less than LRU in
    every disk cell with admission always and in every cell with bypass."""
    from moecache.report import tiers

    relative = "results/tiers/grid.json"
    if not (r.workdir / relative).exists():
        raise Missing(f"no tiered replay's grid ({relative})")
    grid = tiers.read(r.path(relative))
    found_verdict = tiers.verdict_of(grid)
    texts = tiers.lead_texts(found_verdict)
    first = texts[0][0]
    hosts = ", ".join(tiers.host_text(h) for h in grid.hosts)
    found = Found(
        "; ".join(text for shard, text in texts if shard == first),
        verdict(found_verdict.ms_with_disk and found_verdict.ms_with_compute),
        f"C = {', '.join(map(str, grid.capacities))}; H = {hosts}; config prices",
        "",
        [relative],
    )
    found.elsewhere.extend(text for shard, text in texts if shard != first)
    return found


def shuffled_control(r: Results) -> Found:
    heldout, _, setting, path = learned_rows(r)
    control = heldout.get("router/mlp-permuted")
    if control is None or control["gap_recovered"] is None:
        raise Missing(f"no router/mlp-permuted control in {path}")
    share = control["gap_recovered"]
    return Found(
        f"{pct(share)} (router/mlp-permuted, held out)", verdict(share < 0), setting, "", [path]
    )


def controller_frames(r: Results):
    """The controller sweep at 1x: seed means per objective and threshold, and the simple
    restricting runs decoded beside it."""
    from moecache.report import controller as ctl

    folders = r.glob(f"results/controller/sweep/{at_multiplier(1, '')}", "controller sweep")
    files = [f for folder in folders for f in r.glob(f"{folder}/*.json", "sweep results")]
    rows = ctl.sweep_rows([r.path(folder) for folder in folders])
    reference = rows[(rows["objective"] == "") & (rows["multiplier"] == 1)]
    seeds = ctl.seeds_frame(rows)
    if seeds.empty or reference.empty:
        raise Missing("no controller or no simple policy in the sweep")
    objective = seeds["objective"].iloc[0]
    return seeds[seeds["objective"] == objective], reference, objective, files


def controller_t50(r: Results) -> Found:
    seeds, reference, objective, files = controller_frames(r)
    at = seeds[seeds["threshold"] == 0.5]
    # The paper's Dwell-16, else the first dwell run the sweep compares.
    dwell = reference[reference["run"] == "dwell-16"]
    dwell = dwell if len(dwell) else reference[reference["run"].str.startswith("dwell")]
    if at.empty or dwell.empty:
        raise Missing("no controller at threshold 0.5 or no dwell run in the sweep")
    mine, theirs = at.iloc[0], dwell.iloc[0]
    if theirs["copies_per_token"] == 0:
        raise Missing(f"{theirs['run']} copied nothing in the sweep")
    ratio = mine["copies_per_token"] / theirs["copies_per_token"]
    value = (
        f"{ratio:.2f}x {theirs['run']}'s (Delta NLL {mine['delta_nll']:+.3f} against "
        f"{theirs['delta_nll']:+.3f})"
    )
    why = model_why(r, runs_1x(r)[1])
    ok = near(ratio / 2.7, 1, 0.25)
    too_small, logs = heads_power(r, objective)
    return Found(
        value,
        judged(ok, "", too_small),
        f"threshold 0.5, {objective}, seed mean",
        joined(too_small, why),
        [*files, *logs],
    )


def controller_high(r: Results) -> Found:
    seeds, reference, objective, files = controller_frames(r)
    high = seeds[seeds["threshold"] >= 0.8]
    if high.empty:
        raise Missing("no controller threshold of 0.8 or more in the sweep")
    worst_simple = reference["delta_nll"].max()
    least_traffic = reference["copies_per_token"].min()
    cells, ok = [], True
    for _, row in high.iterrows():
        lower = row["copies_per_token"] < least_traffic
        ok &= not lower or row["delta_nll"] > worst_simple
        cells.append(
            f"{row['threshold']:g}: {row['delta_nll']:+.3f} at {row['copies_per_token']:.2f}"
        )
    value = "; ".join(cells) + f" (simple policies at most {worst_simple:+.3f})"
    too_small, logs = heads_power(r, objective)
    setting = f"thresholds >= 0.8, {objective}"
    return Found(value, judged(ok, "", too_small), setting, too_small, [*files, *logs])


def heads_power(r: Results, objective: str) -> tuple[str, list[str]]:
    """Why the controller's heads cannot decide its claims ('' where each unpriced heads
    file of `objective`, the sweep's seed mean, trained to a plateau), and the logs read:
    a controller still learning is not the controller the claims describe."""
    from moecache.report.verdicts.controller import heads_plateau

    folder = r.workdir / "results/controller/heads"
    paths = [p for p in sorted(folder.glob(f"{objective}-s*.json")) if unpriced(p.stem)]
    if not paths:
        return f"no training log of the {objective} heads (results/controller/heads/)", []
    reasons = []
    for path in paths:
        log = read_dict(path, HeadsLog)
        reasons.append(plateau_words(path.stem, log["steps"], heads_plateau(log)))
    return joined(*reasons), [p.relative_to(r.workdir).as_posix() for p in paths]


def unpriced(name: str) -> bool:
    return HeadsName.parse(name).price is None


def plateau_words(name: str, steps: int, found: Plateau | None) -> str:
    """Why a heads file's objective shows no plateau ('' where it does), with the steps of
    training that would show one at the scatter its log shows."""
    if found is None:
        return f"the {name} heads trained {steps} steps, too few to tell a plateau (6 at least)"
    if not found.whole.falls:
        return (
            f"the {name} heads' objective did not fall beyond its noise "
            f"({found.whole.text()}): train until it does (controller.steps)"
        )
    if found.reached:
        return ""
    low, high = found.change
    return (
        f"the {name} heads trained {steps} steps and their objective was still moving over "
        f"the last {found.tail.steps} ({low:+.3f} to {high:+.3f} by its 95% interval, a "
        f"plateau within {found.tolerance:.3f}, {PLATEAU_SHARE:.0%} of its fall "
        f"{found.whole.start:.3f} -> {found.whole.end:.3f}): train to a plateau "
        f"(controller.steps; at this scatter {about(found.steps_needed())} steps would show "
        "one, once it is flat)"
    )


def router_measured(r: Results) -> tuple[dict, list[str]]:
    paths = r.glob("results/router_tuning/measured/*.json", "router measurements")
    measured = [read_dict(r.path(p), TunedModel) for p in paths]
    found = {m["model"]: m for m in measured}
    if "base" not in found:
        raise Missing("no measurement of the untuned router")
    return found, paths


def router_copies(r: Results) -> Found:
    found, paths = router_measured(r)
    if "hit" not in found:
        raise Missing("no cache-hit reward router measured")
    change = (
        found["hit"]["teacher_forced"]["lru_steady"] / found["base"]["teacher_forced"]["lru_steady"]
        - 1
    )
    too_small, logs = routers_learned(r, ["hit"])
    return Found(
        f"{change:+.1%} LRU copies",
        judged(near(change, 0, 0.02), "", too_small),
        "lossless LRU",
        too_small,
        [*paths, *logs],
    )


def lfu_removes(r: Results) -> Found:
    found, paths = router_measured(r)
    removed = {
        name: 1
        - m["teacher_forced"]["decayed_frequency_steady"] / m["teacher_forced"]["lru_steady"]
        for name, m in found.items()
    }
    low, high = min(removed.values()), max(removed.values())
    value = f"{pct(low)} to {pct(high)} ({len(removed)} routers)"
    ok = near(low, 0.135, 0.045) and near(high, 0.135, 0.045)  # every one in 9-18%
    # Every router measured: the tuned ones must have learned for "every router" to mean
    # more than the untuned one measured again.
    too_small, logs = routers_learned(r, [name for name in LEARNED_SERIES if name in found])
    setting = "lossless, every variant"
    return Found(value, judged(ok, "", too_small), setting, too_small, [*paths, *logs])


def routers_learned(r: Results, names: list[str]) -> tuple[str, list[str]]:
    """Why the tuned routers `names` cannot decide a claim on routers tuned for cache hits
    ('' where each one's training series rose beyond its noise: report/verdicts/
    router_tuning.py), and the training logs read. A router that learned nothing copies
    as many as before trivially."""
    reasons, logs = [], []
    for name in names:
        relative = f"results/router_tuning/{name}/training.json"
        if not (r.workdir / relative).exists():
            reasons.append(f"no per-step training log of the {name} router ({relative})")
            continue
        log = read_dict(r.path(relative), TuningLog)
        logs.append(relative)
        reasons.append(rise_words(name, log["steps"], learned_trend(log)))
    return joined(*reasons), logs


def rise_words(name: str, steps: int, found: Trend | None) -> str:
    """Why a router's training series shows no rise ('' where it rose beyond its noise),
    with the steps that would show one at its slope and scatter."""
    series = SERIES_WORDS[LEARNED_SERIES[name]]
    if found is None:
        return f"the {name} router trained {steps} steps, too few to tell its {series} from noise"
    if found.rises:
        return ""
    more = (
        f"; at this slope and scatter {about(steps_to_show(found))} steps"
        if found.slope > 0
        else ""
    )
    return (
        f"the {name} router's {series} did not rise beyond its noise ({found.text()}): "
        f"train until it does (router_tuning.steps{more})"
    )


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


def dp_greedy(r: Results) -> Found:
    sweep, path = r.read("results/replay/optimum-sweep.json", "optimum sweep", OptimumSweep)
    value = f"not optimal on {sweep['greedy_not_optimal']:,} of {sweep['instances']:,}"
    return Found(value, verdict(sweep["greedy_not_optimal"] == 0), "random instances", "", [path])


def dwell_window(r: Results) -> Found:
    # Blocking runs only: an overlapped Dwell decodes fewer sequences (its loss is on those).
    points, paths = runs_1x(r)
    dwell = [  # (window / k, k, run)
        (p.params["window"] / p.params["k"], p.params["k"], p)
        for p in points
        if p.policy == "dwell"
    ]
    if len({d[0] for d in dwell}) < 2:
        raise Missing("no two dwell runs with windows of different length")
    short, long = min(dwell, key=lambda d: d[0]), max(dwell, key=lambda d: d[0])
    a, b = long[2], short[2]
    value = (
        f"{a.run} {a.delta_nll:+.3f} at rho {a.rho:.2f} against {b.run} "
        f"{b.delta_nll:+.3f} at rho {b.rho:.2f}"
    )
    # Copies compare only at the same k (a longer dwell copies less whatever its window);
    # they are exact counts, so only the loss has an interval to weigh.
    same_k = long[1] == short[1]
    lower, said = lower_loss(r, a, b)
    too_small = said if lower is None else ""
    if same_k and a.rho >= b.rho:  # more copies: the claim fails whatever the loss says
        lower, too_small = False, ""
    note = "" if same_k else "different k: loss compared, copies not"
    return Found(
        value, judged(bool(lower), "", too_small), "1x, first shard", joined(too_small, note), paths
    )


def lower_loss(r: Results, a, b) -> tuple[bool | None, str]:
    """Whether run `a` loses less than run `b` by a paired 95% interval over the sequences
    both decoded (their NLL per sequence); None with the sequences that would tell."""
    rows_a = {row.sequence: row for row in read_run(r.path(a.path)).sequences}
    rows_b = {row.sequence: row for row in read_run(r.path(b.path)).sequences}
    both = sorted(set(rows_a) & set(rows_b))
    if not both:
        return None, f"{a.run} and {b.run} share no decoded sequence to pair their losses on"
    point, interval = paired_difference(
        [rows_a[s].nll_sum for s in both],
        [rows_a[s].scored for s in both],
        [rows_b[s].nll_sum for s in both],
        [rows_b[s].scored for s in both],
    )
    if interval[1] < 0 or interval[0] > 0:
        return interval[1] < 0, ""
    size = size_to_clear(len(both), point, interval, 0.0)
    return None, (
        f"{a.run} - {b.run} NLL {point:+.3f} [{interval[0]:+.3f}, {interval[1]:+.3f}] on "
        f"{len(both)} sequences: {about(size)} sequences would tell them apart "
        "(corpus.heldout.sequences)"
    )


def mean_interval(r: Results) -> Found:
    """Today's reading, with the tested cause beside it: the literal reading's share on
    the same trace and capacity (the two differ only in the once-seen convention)."""
    found = gap_share("mean-interval", -0.175)(r)
    report, _, _ = r.replay("replay")
    try:
        literal = share_of("mean-interval-literal")(report)[1]
    except Missing:
        return found
    note = f"the literal reading, a once-seen expert kept, recovers {literal} on this trace"
    found.why = "; ".join(filter(None, [found.why, note]))
    return found
