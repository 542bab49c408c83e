"""The cost model of the paper's equation (1) and the policy chooser built on it.

With copies that block computation, a token costs c + rho * tau ms: c the compute time,
rho the experts copied per token, tau the time of one copy. c and rho come from each
run's measurement at 1x; tau is measured once per machine (`moecache bandwidth`), and a
copy multiplier m prices copies m times slower. Each policy's cost is linear in tau, so the
winner can change only where two lines cross, at tau_ij = (c_j - c_i) / (rho_i - rho_j).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from moecache.atomic import read_json
from moecache.errors import MoecacheError


@dataclass(frozen=True)
class MeasuredRun:
    """One decode run's measured point at 1x: where its line of equation (1) starts."""

    run: str
    policy: str
    delta_nll: float
    compute_ms: float  # c
    rho: float
    tokens_per_second: float
    restricts: bool

    def ms_per_token(self, tau_ms: float) -> float:
        return self.compute_ms + self.rho * tau_ms


def read_run(path) -> dict:
    return read_json(path, "a decode run's results")


def point(report: dict) -> MeasuredRun:
    from moecache.policies import POLICIES

    totals = report["totals"]
    return MeasuredRun(
        run=report["run"],
        policy=report["policy"],
        delta_nll=totals["delta_nll"],
        compute_ms=totals["compute_ms"],
        rho=totals["rho"],
        tokens_per_second=totals["tokens_per_second"],
        restricts=POLICIES[report["policy"]].restricts,
    )


def read_points(paths) -> list[MeasuredRun]:
    points = []
    for path in paths:
        report = read_run(path)
        if report.get("multiplier") != 1:
            raise MoecacheError(
                f"{path}: the cost model reads 1x runs (this is x{report.get('multiplier')})"
            )
        points.append(point(report))
    if not points:
        raise MoecacheError("no decode runs given")
    return points


def choose(points: list[MeasuredRun], tau_ms: float, max_loss: float) -> MeasuredRun:
    """The fastest policy whose Delta NLL is within `max_loss`, at copy time `tau_ms`;
    ties go to the smaller loss, then the run name."""
    admissible = [p for p in points if p.delta_nll <= max_loss]
    if not admissible:
        best = min(p.delta_nll for p in points)
        raise MoecacheError(
            f"--max-loss {max_loss}: no policy is admissible (the smallest Delta NLL is {best:.4g})"
        )
    return min(admissible, key=lambda p: (p.ms_per_token(tau_ms), p.delta_nll, p.run))


def crossover(a: MeasuredRun, b: MeasuredRun) -> float | None:
    """The copy time at which a and b cost the same (None when their lines are parallel)."""
    if a.rho == b.rho:
        return None
    return (b.compute_ms - a.compute_ms) / (a.rho - b.rho)


def crossovers(points: list[MeasuredRun]) -> list[dict]:
    """Every pair whose lines cross at a positive copy time."""
    out = []
    for a, b in itertools.combinations(points, 2):
        tau = crossover(a, b)
        if tau is not None and tau > 0:
            out.append({"a": a.run, "b": b.run, "tau_ms": tau})
    return sorted(out, key=lambda row: row["tau_ms"])


def winner_check(points: list[MeasuredRun], measured: dict[int, dict[str, float]], tau_ms: float):
    """For each multiplier m: among the runs measured at m (run -> measured ms/token), the
    winner equation (1) predicts at m * tau against the one measured fastest."""
    by_run = {p.run: p for p in points}
    rows = []
    for m, runs in sorted(measured.items()):
        known = {run: ms for run, ms in runs.items() if run in by_run}
        if len(known) < 2:
            continue
        predicted = {run: by_run[run].ms_per_token(m * tau_ms) for run in known}
        rows.append(
            {
                "multiplier": m,
                "runs": sorted(known),
                "predicted_winner": min(predicted, key=predicted.get),
                "measured_winner": min(known, key=known.get),
                "predicted_ms": predicted,
                "measured_ms": known,
            }
        )
        rows[-1]["agree"] = rows[-1]["predicted_winner"] == rows[-1]["measured_winner"]
    return rows


def choose_report(points: list[MeasuredRun], tau_ms: float, max_loss: float) -> dict:
    """What `moecache choose` reports: the choice, every run's predicted ms/token (fastest
    first) and whether it is within the loss limit, and the crossovers."""
    best = choose(points, tau_ms, max_loss)
    ranked = sorted(points, key=lambda p: p.ms_per_token(tau_ms))
    return {
        "tau_ms": tau_ms,
        "max_loss": max_loss,
        "choice": best.run,
        "policies": [
            {
                "run": p.run,
                "policy": p.policy,
                "delta_nll": p.delta_nll,
                "compute_ms": p.compute_ms,
                "rho": p.rho,
                "predicted_ms": p.ms_per_token(tau_ms),
                "admissible": p.delta_nll <= max_loss,
            }
            for p in ranked
        ],
        "crossovers": crossovers(points),
    }


def choose_summary(report: dict) -> list[str]:
    """The report of `choose_report` as lines of text."""
    best = next(row for row in report["policies"] if row["run"] == report["choice"])
    lines = [
        f"fastest within Delta NLL {report['max_loss']:g} at tau {report['tau_ms']:.4g} ms: "
        f"{best['run']} ({best['policy']}), {best['predicted_ms']:.3f} ms/token",
        f"{'run':20s} {'Delta NLL':>10s} {'c ms':>8s} {'rho':>6s} {'ms/token':>9s}",
    ]
    for row in report["policies"]:
        mark = "" if row["admissible"] else "  (over the loss limit)"
        lines.append(
            f"{row['run']:20s} {row['delta_nll']:+10.4f} {row['compute_ms']:8.3f} "
            f"{row['rho']:6.2f} {row['predicted_ms']:9.3f}{mark}"
        )
    return lines
