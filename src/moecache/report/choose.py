"""The policy chooser (`moecache choose`): the fastest run within a loss limit at a copy
time tau, by the cost model of equation (1) (moecache.costs.equation), with the
crossovers where the winner changes and the runner-up's paired interval. The all-resident
run is the baseline offloading exists to avoid, so it is no candidate unless asked for.
"""

from __future__ import annotations

import itertools

from moecache.costs.equation import MeasuredRun, compare
from moecache.errors import MoecacheError
from moecache.policies.all_resident import AllResident

# The all-resident policy: the cost offloading exists to avoid, not a choice.
BASELINE = AllResident.name


def choose(
    points: list[MeasuredRun], tau_ms: float, max_loss: float, include_baseline: bool = False
) -> MeasuredRun:
    """The fastest policy whose Delta NLL is within `max_loss`, at copy time `tau_ms`;
    ties go to the smaller loss, then the run name."""
    return ranked_admissible(candidates(points, include_baseline), tau_ms, max_loss)[0]


def candidates(points: list[MeasuredRun], include_baseline: bool = False) -> list[MeasuredRun]:
    """The runs a choice may fall on: the all-resident run only when asked for. Each must
    have a compute time c >= 0 at its tau(1), or that tau(1) is not this machine's."""
    for p in points:
        refuse_negative_compute(p)
    kept = [p for p in points if include_baseline or p.policy != BASELINE]
    if not kept:
        raise MoecacheError(
            f"no run to choose from: only the all-resident run ({BASELINE}) was given "
            "(--include-baseline ranks it)"
        )
    return kept


def refuse_negative_compute(p: MeasuredRun) -> None:
    c = p.compute_ms
    if c >= 0:
        return
    own = p.own_tau_ms
    timed = f"; its own copies took {own:.4g} ms each" if own is not None else ""
    raise MoecacheError(
        f"run {p.run}: compute time c = {p.step_ms:.4g} - {p.n:.4g} x tau(1) comes out "
        f"negative ({c:.4g} ms) at tau(1) = {p.tau1_ms:.4g} ms{timed}: give this machine's "
        "tau(1) (--bandwidth FILE from moecache bandwidth)"
    )


def ranked_admissible(points: list[MeasuredRun], tau_ms: float, max_loss: float):
    admissible = [p for p in points if p.delta_nll <= max_loss]
    if not admissible:
        best = min(p.delta_nll for p in points)
        raise MoecacheError(
            f"--max-loss {max_loss}: no policy is admissible (the smallest Delta NLL is {best:.4g})"
        )
    return sorted(admissible, key=lambda p: (p.ms_per_token(tau_ms), p.delta_nll, p.run))


def crossover(a: MeasuredRun, b: MeasuredRun) -> float | None:
    """The copy time at which a and b cost the same (None when their lines are parallel)."""
    if a.n == b.n:
        return None
    return (b.compute_ms - a.compute_ms) / (a.n - b.n)


def crossovers(points: list[MeasuredRun]) -> list[dict]:
    """Every pair whose lines cross at a positive copy time."""
    out = []
    for a, b in itertools.combinations(points, 2):
        tau = crossover(a, b)
        if tau is not None and tau > 0:
            out.append({"a": a.run, "b": b.run, "tau_ms": tau})
    return sorted(out, key=lambda row: row["tau_ms"])


def choose_report(
    points: list[MeasuredRun],
    tau_ms: float,
    max_loss: float,
    seed: int = 0,
    include_baseline: bool = False,
    tau1_assumed: bool = False,
) -> dict:
    """What `moecache choose` reports: the choice, every run's predicted ms/token (fastest
    first), whether it is within the loss limit and a candidate, the crossovers between
    candidates, and whether the choice is told apart from the next admissible policy at
    the measured noise. `tau1_assumed`: tau(1) was given, not measured on this machine."""
    kept = candidates(points, include_baseline)
    admissible = ranked_admissible(kept, tau_ms, max_loss)
    best = admissible[0]
    return {
        "tau_ms": tau_ms,
        "tau1_ms": best.tau1_ms,
        "tau1_assumed": tau1_assumed,
        "max_loss": max_loss,
        "include_baseline": include_baseline,
        "choice": best.run,
        "runner_up": runner_up(admissible, tau_ms, seed),
        "policies": [
            policy_row(p, tau_ms, max_loss, seed, include_baseline or p.policy != BASELINE)
            for p in sorted(points, key=lambda p: p.ms_per_token(tau_ms))
        ],
        # Equation (1)'s lines only: an overlapped run's cost is not a line in tau.
        "crossovers": crossovers([p for p in kept if not p.overlap]),
    }


def runner_up(admissible: list[MeasuredRun], tau_ms: float, seed: int) -> dict | None:
    """The choice against the next admissible run (None when there is none)."""
    if len(admissible) < 2:
        return None
    best, second = admissible[:2]
    return compare(best, second, tau_ms, seed) or {
        "a": best.run,
        "b": second.run,
        "difference_ms": best.ms_per_token(tau_ms) - second.ms_per_token(tau_ms),
        "interval": None,
        "told_apart": None,  # not decoded on the same sequences
    }


def policy_row(p: MeasuredRun, tau_ms: float, max_loss: float, seed: int, candidate: bool):
    return {
        "run": p.run,
        "policy": p.policy,
        "delta_nll": p.delta_nll,
        "compute_ms": p.compute_ms,
        "copies_per_token": p.n,
        "rho": p.rho,
        "step_ms": p.step_ms,
        "predicted_ms": p.ms_per_token(tau_ms),
        "predicted_ms_ci": p.predicted_interval(tau_ms, seed),
        "admissible": p.delta_nll <= max_loss,
        "candidate": candidate,
        "overlap": p.overlap,
    }


def noise_line(runner_up: dict | None) -> str | None:
    """One line when the choice and the next admissible policy cannot be told apart."""
    if runner_up is None:
        return None
    if runner_up["told_apart"] is None:
        return (
            f"cannot compare {runner_up['a']} with {runner_up['b']} at the measured noise: "
            "they did not decode the same sequences"
        )
    if runner_up["told_apart"]:
        return None
    lo, hi = runner_up["interval"]
    return (
        f"cannot tell {runner_up['a']} from {runner_up['b']} at the measured noise "
        f"(difference {runner_up['difference_ms']:+.3f} ms/token, 95% interval "
        f"{lo:+.3f}..{hi:+.3f})"
    )


def choose_summary(report: dict) -> list[str]:
    """The report of `choose_report` as lines of text."""
    best = next(row for row in report["policies"] if row["run"] == report["choice"])
    lines = [
        f"fastest within Delta NLL {report['max_loss']:g} at tau {report['tau_ms']:.4g} ms: "
        f"{best['run']} ({best['policy']}), {best['predicted_ms']:.3f} ms/token"
    ]
    if report.get("tau1_assumed"):
        lines.append(
            f"assumes tau(1) = {report['tau1_ms']:.4g} ms per copy on this machine (--tau-ms; "
            "no --bandwidth measured it): each run's c = step - n x tau(1)"
        )
    noise = noise_line(report.get("runner_up"))
    if noise:
        lines.append(noise)
    lines.append(
        f"{'run':20s} {'Delta NLL':>10s} {'c ms':>8s} {'n':>6s} {'rho':>6s} {'ms/token':>9s}"
    )
    for row in report["policies"]:
        mark = "" if row["admissible"] else "  (over the loss limit)"
        if row.get("overlap"):
            mark += "  (overlapped: the overlap cost model)"
        if not row.get("candidate", True):
            mark = "  (all-resident baseline, not a candidate: --include-baseline)"
        lines.append(
            f"{row['run']:20s} {row['delta_nll']:+10.4f} {row['compute_ms']:8.3f} "
            f"{row['copies_per_token']:6.2f} {row['rho']:6.2f} {row['predicted_ms']:9.3f}{mark}"
        )
    return lines
