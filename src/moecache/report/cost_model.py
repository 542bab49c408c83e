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
class Policy:
    """One decode run's measured point at 1x."""

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


def point(report: dict) -> Policy:
    from moecache.policies import POLICIES

    totals = report["totals"]
    return Policy(
        run=report["run"],
        policy=report["policy"],
        delta_nll=totals["delta_nll"],
        compute_ms=totals["compute_ms"],
        rho=totals["rho"],
        tokens_per_second=totals["tokens_per_second"],
        restricts=POLICIES[report["policy"]].restricts,
    )


def read_points(paths) -> list[Policy]:
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


def choose(points: list[Policy], tau_ms: float, max_loss: float) -> Policy:
    """The fastest policy whose Delta NLL is within `max_loss`, at copy time `tau_ms`;
    ties go to the smaller loss, then the run name."""
    admissible = [p for p in points if p.delta_nll <= max_loss]
    if not admissible:
        best = min(p.delta_nll for p in points)
        raise MoecacheError(
            f"--max-loss {max_loss}: no policy is admissible (the smallest Delta NLL is {best:.4g})"
        )
    return min(admissible, key=lambda p: (p.ms_per_token(tau_ms), p.delta_nll, p.run))


def crossover(a: Policy, b: Policy) -> float | None:
    """The copy time at which a and b cost the same (None when their lines are parallel)."""
    if a.rho == b.rho:
        return None
    return (b.compute_ms - a.compute_ms) / (a.rho - b.rho)


def crossovers(points: list[Policy]) -> list[dict]:
    """Every pair whose lines cross at a positive copy time."""
    out = []
    for a, b in itertools.combinations(points, 2):
        tau = crossover(a, b)
        if tau is not None and tau > 0:
            out.append({"a": a.run, "b": b.run, "tau_ms": tau})
    return sorted(out, key=lambda row: row["tau_ms"])


def winner_check(points: list[Policy], measured: dict[int, dict[str, float]], tau_ms: float):
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
