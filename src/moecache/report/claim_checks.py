"""One function per claim of the paper: each reads its results files through `Results`
and answers with this run's value, the setting, the verdict and the files (`Found`), or
raises `Missing`. The tolerances are the verdicts' own; claims.CLAIMS states them."""

from __future__ import annotations

from collections.abc import Callable

from moecache.records.accuracy import AccuracySummary
from moecache.records.io import read_dict, read_run
from moecache.records.learned import LearnedEvaluation
from moecache.records.replay import OptimumSweep
from moecache.records.router_tuning import TunedModel
from moecache.report.evidence import (
    DIFFERS,
    PAPER_RATIO,
    Found,
    Missing,
    Results,
    at_capacity,
    judged,
    model_why,
    near,
    pct,
    runs_1x,
    verdict,
)
from moecache.runs import RunName, at_multiplier

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
    checks = tables.cost_model_part(full[: len(runs)], full[len(runs) : -1], full[-1:]).checks
    found = {int(c["multiplier"]): c for c in checks if c.get("measured_winner")}
    wanted = [m for m in (10, 50) if m in found]
    if not wanted:
        raise Missing("no winner check at 10x or 50x")
    agree = {m: winner_agrees(found[m]) for m in wanted}
    value = "; ".join(winner_text(m, found[m]) for m in wanted)
    why = "" if len(wanted) == 2 else f"runs repeated at {wanted[0]}x only"
    return Found(
        value, judged(all(agree.values()), why), "10x and 50x", why, [*runs, *scaled, *bandwidth]
    )


def winner_agrees(check: dict) -> bool:
    """Equation (1) agrees with the measurement when it predicts the measured winner, or the
    runner-up the measured winner is not told apart from (their 95% intervals overlap: the
    measurement cannot rank the two, so neither choice contradicts it)."""
    predicted = check["predicted_winner"]
    if predicted == check["measured_winner"]:
        return True
    return predicted == check["runner_up"] and not check["told_apart"]


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
    shard; holds when it reaches half the gap everywhere with its interval above 32.5%."""
    from moecache.report import causal

    relative = "results/learned/causal.json"
    if not (r.workdir / relative).exists():
        raise Missing(f"no causal rules' study ({relative})")
    study = causal.read(r.path(relative))
    rule, texts, meets = causal.best_rule(study)
    shown = len(study.capacities)  # the first shard at every capacity; the others beside
    capacities = ", ".join(map(str, study.capacities))
    found = Found(
        f"{'; '.join(texts[:shown])} ({rule})",
        verdict(meets),
        f"C = {capacities}, every sequence",
        "",
        [relative],
    )
    found.elsewhere.extend(texts[shown:])
    checked = "results/learned/causal-check.json"
    if (r.workdir / checked).exists():
        check = causal.read_check(r.path(checked))
        if rule in check.cost["rules"]:
            found.why = causal.check_words(check, rule)
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
    return Found(value, verdict(ok), f"threshold 0.5, {objective}, seed mean", why, files)


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
    return Found(value, verdict(ok), f"thresholds >= 0.8, {objective}", "", files)


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
    return Found(
        f"{change:+.1%} LRU copies", verdict(near(change, 0, 0.02)), "lossless LRU", "", paths
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
    return Found(value, verdict(ok), "lossless, every variant", "", paths)


TABLE2_ORDER = ("free", "oracle-set", "recent-use")


def table2_order(r: Results) -> Found:
    paths = r.glob("results/accuracy/*/summary.json", "accuracy summaries")
    chosen = next((p for p in paths if "/mmlu/" in p), paths[0])
    summary = read_dict(r.path(chosen), AccuracySummary)
    accuracy = {row["row"]: row["accuracy"] for row in summary["rows"]}
    learned = [v for k, v in accuracy.items() if k.endswith("-matched")]
    if not learned or any(name not in accuracy for name in TABLE2_ORDER):
        raise Missing(f"a Table 2 row is missing from {chosen}")
    order = [accuracy[name] for name in TABLE2_ORDER] + [sum(learned) / len(learned)]
    value = " >= ".join(f"{a:.3f}" for a in order) + " (free, oracle, recent, learned)"
    task = summary["task"].removeprefix("moecache_")
    setting = f"task {task}, {summary['questions']} questions"
    why = ""
    if len(set(order)) == 1:
        why = f"every row scores {order[0]:.3f} (chance {summary['chance']:.3f}): no ordering"
    ok = all(a >= b for a, b in zip(order, order[1:], strict=False))
    return Found(value, judged(ok, why), setting, why, [chosen])


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
    # Copies compare only at the same k (a longer dwell copies less whatever its window).
    same_k = long[1] == short[1]
    ok = a.delta_nll < b.delta_nll and (not same_k or a.rho < b.rho)
    why = "" if same_k else "different k: loss compared, copies not"
    return Found(value, verdict(ok), "1x, first shard", why, paths)


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
