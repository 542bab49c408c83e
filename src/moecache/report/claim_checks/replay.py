"""The replay claims: farthest-future against LRU and the bounds, foresight's curve, the
shares of the gap each rule closes; and the cost model's winner beside the measured one."""

from __future__ import annotations

from collections.abc import Callable

from moecache.records.io import read_run
from moecache.report.evidence import (
    DIFFERS,
    Found,
    Missing,
    Results,
    at_capacity,
    joined,
    judged,
    model_why,
    near,
    pct,
    runs_1x,
)
from moecache.report.power import about, whole
from moecache.runs import RunName

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
