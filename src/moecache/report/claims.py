"""The reproduction scorecard: one row per quantitative claim of the paper, in the paper's
order, each answered from this run's results files at the matching setting.

A row is data: the claim, where the paper makes it, the paper's value, this run's, the
setting it was read at (capacity, multiplier, threshold), the tolerance and the verdict
(`holds`, `differs`, `not comparable` with why, or `not run` where an input is missing),
with the files it came from. Rendering (claims.md, the README's block) comes afterwards.
Replay claims are read at the paper's ratio C = N/2 where the run replayed it
(`replay.capacities`), on the first shard replayed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from moecache.atomic import read_json
from moecache.errors import MoecacheError
from moecache.report import replayed

PAPER_RATIO = 0.5  # C / N in the paper: 32 of 64 experts resident
PAPER_MODEL = "OLMoE-1B-7B"  # NLL and accuracy sizes compare only on the paper's model
HOLDS, DIFFERS, NOT_COMPARABLE, NOT_RUN = "holds", "differs", "not comparable", "not run"


class Missing(Exception):
    """An input of a claim that this run did not produce."""


@dataclass
class Found:
    value: str  # this run's value, as the row shows it
    verdict: str
    setting: str = ""
    why: str = ""
    sources: list[str] = field(default_factory=list)


def verdict(ok: bool) -> str:
    return HOLDS if ok else DIFFERS


def pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%"


class Results:
    """The results files of one run folder, read on demand; a missing one is Missing."""

    def __init__(self, workdir, shards=None):
        self.workdir = Path(workdir)
        found = sorted(p.name for p in (self.workdir / "results/runs").glob("*") if p.is_dir())
        self.shards = list(shards) if shards else found

    def path(self, relative: str) -> str:
        return str(self.workdir / relative)

    def read(self, relative: str, what: str) -> tuple[dict, str]:
        path = self.workdir / relative
        if not path.exists():
            raise Missing(f"no {what} ({relative})")
        return read_json(path), relative

    def glob(self, pattern: str, what: str) -> list[str]:
        found = sorted(p.relative_to(self.workdir).as_posix() for p in self.workdir.glob(pattern))
        if not found:
            raise Missing(f"no {what} ({pattern})")
        return found

    def replay(self, name: str) -> tuple[dict, str, bool]:
        """`name` (replay, bound, foresight) on the first replayed shard at C = N/2, else
        at the trace run's C; the flag says whether the capacity is the paper's ratio."""
        for shard in self.shards:
            found = replayed.found(self.workdir, "replay", [shard])
            if not found:
                continue
            experts = read_json(found[0][2])["experts"]
            paper = [row for row in found if row[1] == PAPER_RATIO * experts]
            _, capacity, path = (paper or found)[0]
            wanted = path.with_name(f"{name}.json")
            if not wanted.exists():
                raise Missing(f"no {name} at C = {capacity} ({wanted.name})")
            relative = wanted.relative_to(self.workdir).as_posix()
            return read_json(wanted), relative, bool(paper)
        raise Missing("no replay results")


def at_capacity(report: dict, paper_ratio: bool, path: str) -> tuple[str, str]:
    """The setting a replay claim was read at, and why it is not comparable (or '')."""
    n = report.get("experts")
    setting = f"C = {report['capacity']}" + (f" of {n}" if n else "")
    setting += f", shard {replayed.shard_of(path)}"
    why = "" if paper_ratio else "no replay at the paper's C = N/2 (replay.capacities)"
    return setting, why


def replay_rule(r: Results, rule: str) -> tuple[dict, dict, str, str, str]:
    """A rule's and LRU's totals at the paper's capacity, the setting, why-not, the file."""
    report, path, paper = r.replay("replay")
    if rule not in report["rules"]:
        raise Missing(f"rule {rule} was not replayed ({path})")
    setting, why = at_capacity(report, paper, path)
    return report["rules"][rule]["totals"], report["rules"]["lru"]["totals"], setting, why, path


def judged(ok: bool, why: str) -> str:
    return NOT_COMPARABLE if why else verdict(ok)


# ------------------------------------------------------------------------ replay claims


def ff_vs_lru(r: Results) -> Found:
    ff, lru, setting, why, path = replay_rule(r, "farthest-future")
    ratio = lru["after_fill"] / ff["after_fill"]
    value = f"{ratio:.2f}x ({lru['after_fill']:,} -> {ff['after_fill']:,})"
    return Found(value, judged(abs(ratio / 2.1 - 1) <= 0.10, why), setting, why, [path])


def ff_vs_bflat(r: Results) -> Found:
    report, path, paper = r.replay("bound")
    setting, why = at_capacity(report, paper, path)
    t = report["totals"]
    value = f"{pct(t['gap'])} (B_flat {t['b_flat']:,}, B_greedy {t['b_greedy']:,})"
    return Found(value, judged(t["gap"] <= 0.045, why), setting, why, [path])


def ff_vs_bstar(r: Results) -> Found:
    report, path, paper = r.replay("bound")
    setting, why = at_capacity(report, paper, path)
    t = report["totals"]
    value = f"{pct(t['greedy_gap'])} (B* {t['b_star']:,} by the LP)"
    return Found(value, judged(t["greedy_gap"] <= 0.035, why), setting, why, [path])


def foresight_points(r: Results) -> tuple[dict, str, str, str]:
    report, path, paper = r.replay("foresight")
    setting, why = at_capacity(report, paper, path)
    subset = "heldout" if report["subsets"]["heldout"]["streams"] else "all"
    points = {p["k"]: p["gap_recovered"] for p in report["subsets"][subset]["foresight"]}
    return points, f"{setting}, {subset} sequences", why, path


def foresight_16(r: Results) -> Found:
    points, setting, why, path = foresight_points(r)
    if points.get(16) is None:
        raise Missing(f"no foresight k = 16 (replay.foresight; {path})")
    return Found(pct(points[16]), judged(abs(points[16] - 0.96) <= 0.05, why), setting, why, [path])


FORESIGHT_CURVE = {1: 0.17, 2: 0.31, 4: 0.51, 8: 0.76, 16: 0.96, 32: 0.997}


def foresight_curve(r: Results) -> Found:
    points, setting, why, path = foresight_points(r)
    ks = [k for k in FORESIGHT_CURVE if points.get(k) is not None]
    if not ks:
        raise Missing(f"no foresight at k = 1, 2, 4, 8, 16 or 32 ({path})")
    value = "/".join(f"{100 * points[k]:.0f}" for k in ks) + f"% at k = {', '.join(map(str, ks))}"
    worst = max(abs(points[k] - FORESIGHT_CURVE[k]) for k in ks)
    return Found(value, judged(worst <= 0.10, why), setting, why, [path])


def gap_share(rule: str, paper: float) -> Callable[[Results], Found]:
    def claim(r: Results) -> Found:
        totals, _, setting, why, path = replay_rule(r, rule)
        share = totals["gap_recovered"]
        ok = share is not None and abs(share - paper) <= 0.05
        return Found(pct(share or 0.0), judged(ok, why), setting, why, [path])

    return claim


def router_logit(r: Results) -> Found:
    rule, lru, setting, why, path = replay_rule(r, "router-logit")
    more = rule["after_fill"] / lru["after_fill"] - 1
    value = f"{more:+.1%} against LRU (replayed)"
    return Found(value, judged(abs(more - 0.46) <= 0.10, why), setting, why, [path])


# ------------------------------------------------------------------------ other claims


@dataclass
class Run:
    run: str
    policy: str
    params: dict
    restricts: bool
    tokens_per_second: float
    delta_nll: float
    rho: float


def runs_1x(r: Results) -> tuple[list[Run], list[str]]:
    """Every run at 1x on the first shard: what the claims read of it."""
    from moecache.policies import POLICIES

    paths = r.glob(f"results/runs/{r.shards[0] if r.shards else '*'}/*-x1.json", "runs at 1x")
    runs = []
    for path in paths:
        report = read_json(r.path(path))
        t = report["totals"]
        restricts = POLICIES[report["policy"]].restricts
        runs.append(
            Run(
                report["run"],
                report["policy"],
                report.get("params", {}),
                restricts,
                t["tokens_per_second"],
                t["delta_nll"],
                t["rho"],
            )
        )
    return runs, paths


def model_why(r: Results, paths: list[str]) -> str:
    """Why NLL sizes do not compare: the model is not the paper's (or '')."""
    for path in paths:
        run = read_json(r.path(path))
        source = run["settings"]["model"]["source"]
        if PAPER_MODEL not in source:
            return f"model {source}, base NLL {run['base_nll']:.2f}: NLL sizes are not the paper's"
    return ""


def restrict_cost(r: Results) -> Found:
    points, paths = runs_1x(r)
    lru = next((p for p in points if p.policy == "lru"), None)
    if lru is None:
        raise Missing("no lru run at 1x")
    faster = [p for p in points if p.restricts and p.tokens_per_second > lru.tokens_per_second]
    if not faster:
        return Found("none faster than LRU", DIFFERS, "1x", "", paths)
    cheapest = min(faster, key=lambda p: p.delta_nll)
    value = f"+{cheapest.delta_nll:.3f} ({cheapest.run}; {len(faster)} faster than LRU)"
    why = model_why(r, paths)
    ok = cheapest.delta_nll >= 0.067
    if why:  # the direction still compares: does every faster one lose quality?
        loses = "yes" if cheapest.delta_nll > 0 else "no"
        why += f"; every faster restricting run loses quality: {loses}"
    return Found(value, judged(ok, why), "1x, first shard", why, paths)


def cost_model_winner(r: Results) -> Found:
    from moecache.report import tables

    _, runs = runs_1x(r)
    scaled = r.glob(f"results/runs/{r.shards[0]}/*-x[0-9]*.json", "runs at multipliers")
    scaled = [p for p in scaled if not p.endswith("-x1.json")]
    bandwidth = r.glob("results/bandwidth/*.json", "bandwidth file")[:1]
    if not scaled:
        raise Missing("no run repeated at a copy multiplier")
    full = [r.path(p) for p in (*runs, *scaled, *bandwidth)]
    _, _, checks, _ = tables.cost_model_part(full[: len(runs)], full[len(runs) : -1], full[-1:])
    found = {int(c["multiplier"]): c for c in checks if c.get("measured_winner")}
    wanted = [m for m in (10, 50) if m in found]
    if not wanted:
        raise Missing("no winner check at 10x or 50x")
    agree = {m: found[m]["predicted_winner"] == found[m]["measured_winner"] for m in wanted}
    value = "; ".join(
        f"{m}x: predicted {found[m]['predicted_winner']}, measured {found[m]['measured_winner']}"
        for m in wanted
    )
    why = "" if len(wanted) == 2 else f"runs repeated at {wanted[0]}x only"
    return Found(
        value, judged(all(agree.values()), why), "10x and 50x", why, [*runs, *scaled, *bandwidth]
    )


def learned_rows(r: Results) -> tuple[dict, int, str, str]:
    evaluation, path = r.read("results/learned/evaluation.json", "learned evaluation")
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
    return Found(value, judged(abs(router[best] - 0.325) <= 0.05, why), setting, why, [path])


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

    folders = r.glob("results/controller/sweep/*-x1", "controller sweep")
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
    ok = abs(ratio / 2.7 - 1) <= 0.25
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
    found = {read_json(r.path(p))["model"]: read_json(r.path(p)) for p in paths}
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
        f"{change:+.1%} LRU copies", verdict(abs(change) <= 0.02), "lossless LRU", "", paths
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
    return Found(value, verdict(low >= 0.09 and high <= 0.18), "lossless, every variant", "", paths)


TABLE2_ORDER = ("free", "oracle-set", "recent-use")


def table2_order(r: Results) -> Found:
    paths = r.glob("results/accuracy/*/summary.json", "accuracy summaries")
    chosen = next((p for p in paths if "/mmlu/" in p), paths[0])
    summary = read_json(r.path(chosen))
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
    sweep, path = r.read("results/replay/optimum-sweep.json", "optimum sweep")
    value = f"not optimal on {sweep['greedy_not_optimal']:,} of {sweep['instances']:,}"
    return Found(value, verdict(sweep["greedy_not_optimal"] == 0), "random instances", "", [path])


def dwell_window(r: Results) -> Found:
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


# ------------------------------------------------------------------------ the scorecard


@dataclass(frozen=True)
class Claim:
    key: str
    claim: str
    where: str
    paper: str
    tolerance: str
    answer: Callable[[Results], Found]


# In the paper's order (first mention). Tolerances are the verdicts' own thresholds.
CLAIMS = [
    Claim(
        "restrict_cost",
        "every restricting policy faster than LRU loses >= 0.067 nats",
        "Abstract; §3.1, Fig. 1",
        "+0.067 (Dwell-16)",
        "least loss >= 0.067",
        restrict_cost,
    ),
    Claim(
        "ff_vs_lru",
        "farthest-future copies fewer experts than LRU",
        "Abstract; §3.2",
        "2.1x (31,776 -> 15,087)",
        "±10% of 2.1x",
        ff_vs_lru,
    ),
    Claim(
        "ff_vs_bflat",
        "farthest-future within 3.5% of the fewest copies (bound B_flat)",
        "Abstract; App. §6",
        "3.4% (14,587 vs 15,087)",
        "gap <= 4.5%",
        ff_vs_bflat,
    ),
    Claim(
        "ff_vs_bstar",
        "farthest-future within 3.5% of the fewest copies (exact B*)",
        "Abstract; App. §6",
        "<= 3.5% (B* not computed)",
        "gap <= 3.5%",
        ff_vs_bstar,
    ),
    Claim(
        "foresight_16",
        "16 tokens of foresight recover most of the reduction",
        "Abstract; §3.2",
        "96%",
        "±5 points",
        foresight_16,
    ),
    Claim(
        "decayed_frequency",
        "decayed-frequency eviction, share of the LRU-oracle gap",
        "Abstract; §3.2; App. §7",
        "26.9%",
        "±5 points",
        gap_share("decayed-frequency", 0.269),
    ),
    Claim(
        "cost_model_winner",
        "equation (1) picks the measured winner at 10x and 50x",
        "§1; §3.1",
        "agrees at both",
        "same run",
        cost_model_winner,
    ),
    Claim(
        "learned_scorers",
        "learned scorer with router features, share of the gap",
        "§3.2; App. §7",
        "32-33% (held out)",
        "±5 points of 32.5%",
        learned_scorers,
    ),
    Claim(
        "controller_t50",
        "controller at 0.5 copies 2.7x Dwell-16's at similar loss",
        "§3.3",
        "2.7x (+0.076 vs +0.067)",
        "±25% of 2.7x",
        controller_t50,
    ),
    Claim(
        "controller_high",
        "thresholds 0.8-0.9 lower traffic only with large losses",
        "§3.3",
        "+0.238, +0.350 (simple <= +0.110)",
        "lower traffic => loss above all simple",
        controller_high,
    ),
    Claim(
        "router_copies",
        "router fine-tuned for cache hits copies as many as before",
        "§3.3; App. §9",
        "+0.4% (32,050 vs 31,915)",
        "±2%",
        router_copies,
    ),
    Claim(
        "dwell_window",
        "Dwell's longer window lowers loss (and copies)",
        "Table 1; App. §5, §10",
        "+0.067 vs +0.085; +0.073 vs +0.150",
        "lower loss",
        dwell_window,
    ),
    Claim(
        "dp_greedy",
        "greedy farthest-future optimal on every exact-DP instance",
        "App. §6",
        "0 of 4.2e4 not optimal",
        "none not optimal",
        dp_greedy,
    ),
    Claim(
        "mean_interval",
        "mean-interval eviction, share of the gap (today's reading: "
        "a once-seen expert evicted first)",
        "App. §7",
        "-17.5% (worse than LRU)",
        "±5 points",
        gap_share("mean-interval", -0.175),
    ),
    Claim(
        "mean_interval_literal",
        "mean-interval eviction, share of the gap (literal reading: a once-seen expert kept)",
        "App. §7",
        "-17.5% (worse than LRU)",
        "±5 points",
        gap_share("mean-interval-literal", -0.175),
    ),
    Claim(
        "router_logit",
        "router-logit eviction copies more than LRU",
        "App. §7",
        "+46% (closed loop)",
        "±10 points",
        router_logit,
    ),
    Claim(
        "shuffled_control",
        "scorer on shuffled labels does worse than LRU",
        "App. §7",
        "-34% (router), -136% (past use)",
        "below 0",
        shuffled_control,
    ),
    Claim(
        "foresight_curve",
        "foresight curve, share of the gap at k = 1-32 tokens",
        "App. §7, Fig. 2",
        "17/31/51/76/96/99.7%",
        "±10 points at every k",
        foresight_curve,
    ),
    Claim(
        "table2_order",
        "fixed-set accuracy ordering: free >= oracle > recent > learned",
        "App. §8, Table 2",
        "0.484 >= 0.481 > 0.430 > 0.413",
        "same order",
        table2_order,
    ),
    Claim(
        "lfu_removes",
        "decayed frequency removes 12-15% of every router's copies",
        "App. §9, Table 3",
        "12-15%",
        "each within 9-18%",
        lfu_removes,
    ),
]

COLUMNS = [
    "key",
    "claim",
    "where",
    "paper",
    "this_run",
    "setting",
    "tolerance",
    "verdict",
    "why",
    "sources",
]


def row(claim: Claim, results: Results) -> dict:
    try:
        found = claim.answer(results)
    except Missing as missing:
        found = Found("not run", NOT_RUN, why=str(missing))
    except (KeyError, IndexError, TypeError) as error:
        raise MoecacheError(
            f"claim {claim.key}: a results file lacks or mistypes {error} (written by an "
            "older moecache? rerun its rule)"
        ) from None
    return {
        "key": claim.key,
        "claim": claim.claim,
        "where": claim.where,
        "paper": claim.paper,
        "this_run": found.value,
        "setting": found.setting,
        "tolerance": claim.tolerance,
        "verdict": found.verdict,
        "why": found.why,
        "sources": " ".join(found.sources),
    }


def scorecard(workdir, shards=None) -> list[dict]:
    """Every claim's row, from whatever results exist under `workdir`."""
    if not Path(workdir, "results").is_dir():
        raise MoecacheError(f"{workdir}: no results/ folder (run the pipeline there first)")
    results = Results(workdir, shards)
    return [row(claim, results) for claim in CLAIMS]


# ------------------------------------------------------------------------ rendering

HEADER = ["claim", "where", "paper", "this run", "setting", "tolerance", "verdict", "from"]


def shown_sources(sources: str) -> str:
    """A row's files, folded to their folder when there are more than two."""
    files = sources.split()
    if len(files) <= 2:
        return ", ".join(f"`{f}`" for f in files)
    folders = sorted({str(Path(f).parent) for f in files})
    return ", ".join(f"`{d}/`" for d in folders) + f" ({len(files)} files)"


def markdown_table(rows: list[dict]) -> str:
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|")

    lines = ["| " + " | ".join(HEADER) + " |", "| " + " | ".join("---" for _ in HEADER) + " |"]
    for r in rows:
        # Why a claim could not be judged follows a colon; a note on a judged one, brackets.
        note = r["why"] and (
            f": {r['why']}" if r["verdict"] in (NOT_COMPARABLE, NOT_RUN) else f" ({r['why']})"
        )
        said = r["verdict"] + note
        cells = [
            r["claim"],
            r["where"],
            r["paper"],
            r["this_run"],
            r["setting"],
            r["tolerance"],
            f"**{said}**" if r["verdict"] == HOLDS else said,
            shown_sources(r["sources"]),
        ]
        lines.append("| " + " | ".join(map(cell, cells)) + " |")
    return "\n".join(lines)


def tally(rows: list[dict]) -> str:
    counts = {
        v: sum(r["verdict"] == v for r in rows) for v in (HOLDS, DIFFERS, NOT_COMPARABLE, NOT_RUN)
    }
    return f"{len(rows)} claims: " + ", ".join(f"{v} {n}" for v, n in counts.items()) + "."


def render(rows: list[dict]) -> str:
    """The scorecard as the README's block and claims.md show it."""
    return f"{markdown_table(rows)}\n\n{tally(rows)}"


CAPTION = (
    "One row per quantitative claim of the paper, in the paper's order: where the paper "
    "makes it, its value, this run's value at the matching setting (replay claims at the "
    "paper's ratio C = N/2 where `replay.capacities` has it), the tolerance the verdict "
    "uses and the verdict. `not comparable` says why (a tiny model's NLL scale, a capacity "
    "or multiplier this run lacks); `not run`: this run has no results for it. Every value "
    "is read from the files named in the last column (`claims.csv` lists each file)."
)


def read_rows(path) -> list[dict]:
    """The rows of a claims.csv (the README's block renders them as claims.md does)."""
    import pandas as pd

    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise MoecacheError(f"{path}: missing (run `moecache claims` first)") from None
    lacking = [c for c in COLUMNS if c not in frame.columns]
    if lacking:
        raise MoecacheError(f"{path}: not a scorecard (no column {lacking[0]})")
    return frame.to_dict("records")


def write(rows: list[dict], out_dir, workdir=".") -> None:
    """claims.csv, claims.md and claims.sources.json under `out_dir`, each written whole."""
    import pandas as pd

    from moecache import provenance
    from moecache.atomic import atomic_file, write_json, write_text

    out_dir = Path(out_dir)
    with atomic_file(out_dir / "claims.csv") as tmp:
        pd.DataFrame(rows, columns=COLUMNS).to_csv(tmp, index=False)
    text = f"### Reproduction scorecard\n\n{CAPTION}\n\n{render(rows)}\n"
    write_text(out_dir / "claims.md", text)
    used = sorted({f for r in rows for f in r["sources"].split()})
    write_json(
        out_dir / "claims.sources.json", provenance.sources([Path(workdir) / f for f in used])
    )
