"""The cost model of the paper's equation (1); the policy chooser built on it is
moecache.report.choose.

With copies that block computation, a token costs c + n * tau ms: n the experts copied per
timed token (every copy, the fills after a sequence's first token included, not only the
steady copies rho), tau the time of one copy. tau(m) is measured once per machine and copy
multiplier m (`moecache bandwidth`: the slope through groups of 1, 2, 4 and 8 copies, the
fixed cost of a group apart). c comes from each run's measured step at 1x:

    c = step_ms(1x) - n * tau(1),

so c holds the compute and the per-group overhead of the copies, and at 1x the prediction
reproduces the measured step exactly. The prediction at multiplier m is c + n * tau(m).
Each policy's cost is linear in tau, so the winner can change only where two lines cross,
at tau_ij = (c_j - c_i) / (n_i - n_j). That is what `moecache choose` and Figure 1 use.

The check against the runs repeated at m > 1 (`cost_rows`) predicts each from its 1x twin:
the same policy decoded at 1x token by token beside it, on the same sequences, so that
the machine's drift falls on both alike (a results file without a twin falls back to the
run's own 1x run on those sequences). tau(1) there is the time per copy as the twin timed
its own copies (after each token's compute, as they happen), and tau(m) = m tau(1), the
slower link's definition. The bandwidth file's tau(m) is shown beside it.

Intervals resample sequences (every run of a shard decodes the same sequences): a run's
predicted ms/token is the token-weighted mean of its sequences' c_s + n_s * tau, with
c_s = step_s / timed_s - n_s * tau(1) and n_s = timed_copies_s / timed_s.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np

from moecache.errors import MoecacheError
from moecache.intervals import bootstrap_ratio, paired_difference
from moecache.records.io import read_run_dict

WITHIN = 0.05  # "within 5%": |predicted / measured - 1| <= WITHIN

# The totals and per-sequence keys the cost model reads from a decode run.
TOTALS = (
    "delta_nll",
    "step_ms",
    "step_ms_ci",
    "tokens_per_second",
    "tokens_per_second_ci",
    "rho",
    "copies_per_token",
    "copy_share",
    "compute_ms",
    "compute_ms_ci",
)
SEQUENCE_KEYS = ("sequence", "timed_tokens", "step_seconds", "timed_copies", "copy_seconds")


@dataclass(frozen=True)
class MeasuredRun:
    """One decode run as measured: its totals and its per-sequence timing. With `tau1_ms`
    (this machine's tau(1), `priced`) it is a line of equation (1): c + n * tau."""

    run: str
    policy: str
    multiplier: float
    delta_nll: float
    restricts: bool
    step_ms: float
    step_ms_ci: tuple[float, float]
    tokens_per_second: float
    tokens_per_second_ci: tuple[float, float]
    rho: float  # steady copies per timed token
    copies_per_token: float  # n: every copy made at a timed token
    copy_share: float  # copy time / step time, as timed by the harness
    measured_compute_ms: float  # step minus the timed copy time
    measured_compute_ms_ci: tuple[float, float]
    shard: str | None = None
    # Per sequence, in the order of the results file.
    sequences: tuple = ()
    seq_tokens: tuple = ()  # timed tokens
    seq_step_ms: tuple = ()  # ms of all its timed steps
    seq_copies: tuple = ()  # copies at its timed tokens
    seq_copy_ms: tuple = ()  # ms of those copies, as the harness timed them
    tau1_ms: float | None = None
    twin: MeasuredRun | None = None  # for a run at m > 1: its 1x twin (equation (1)'s base)
    overlap: bool = False  # a line of equation (1); costs.overlap.OverlappedPoint is not

    @property
    def n(self) -> float:
        return self.copies_per_token

    def on(self, sequences) -> MeasuredRun:
        """This run's step time and copies on the given sequences only (a run at a
        multiplier may decode the first few: equation (1) predicts it from those)."""
        keep = [i for i, seq in enumerate(self.sequences) if seq in set(sequences)]
        if len(keep) == len(self.sequences):
            return self
        tokens = sum(self.seq_tokens[i] for i in keep)
        return dataclasses.replace(
            self,
            step_ms=sum(self.seq_step_ms[i] for i in keep) / tokens,
            copies_per_token=sum(self.seq_copies[i] for i in keep) / tokens,
            sequences=tuple(self.sequences[i] for i in keep),
            seq_tokens=tuple(self.seq_tokens[i] for i in keep),
            seq_step_ms=tuple(self.seq_step_ms[i] for i in keep),
            seq_copies=tuple(self.seq_copies[i] for i in keep),
            seq_copy_ms=tuple(self.seq_copy_ms[i] for i in keep),
        )

    @property
    def own_tau_ms(self) -> float | None:
        """The time per copy as this run timed its own copies (None without copies)."""
        copies = sum(self.seq_copies)
        return sum(self.seq_copy_ms) / copies if copies else None

    def priced(self, tau1_ms: float) -> MeasuredRun:
        """This run with this machine's tau(1), which sets its c."""
        return dataclasses.replace(self, tau1_ms=tau1_ms)

    @property
    def compute_ms(self) -> float:
        """c = step_ms(1x) - n * tau(1): compute, with the per-group copy overhead."""
        if self.tau1_ms is None:
            raise MoecacheError(f"run {self.run}: c needs this machine's tau(1) (priced)")
        return self.step_ms - self.n * self.tau1_ms

    def ms_per_token(self, tau_ms: float) -> float:
        return self.compute_ms + self.n * tau_ms

    def sequence_numerators(self, tau_ms: float) -> np.ndarray:
        """Per sequence, timed_s * (c_s + n_s * tau): predicted ms summed over its tokens."""
        if self.tau1_ms is None:
            raise MoecacheError(f"run {self.run}: c needs this machine's tau(1) (priced)")
        steps, copies = np.asarray(self.seq_step_ms, float), np.asarray(self.seq_copies, float)
        return steps + copies * (tau_ms - self.tau1_ms)

    def predicted_interval(self, tau_ms: float, seed: int = 0, level: float = 0.95):
        """Bootstrap interval over sequences of the predicted ms/token at `tau_ms`."""
        if not self.sequences:
            return None
        return bootstrap_ratio(self.sequence_numerators(tau_ms), self.seq_tokens, seed, level)


def compare(a: MeasuredRun, b: MeasuredRun, tau_ms: float, seed: int = 0) -> dict | None:
    """Predicted ms/token of a minus b at `tau_ms`, with a paired bootstrap interval over
    the sequences both decoded; None when they did not decode the same sequences."""
    if not a.sequences or a.shard != b.shard or sorted(a.sequences) != sorted(b.sequences):
        return None
    order = {s: i for i, s in enumerate(b.sequences)}
    idx = [order[s] for s in a.sequences]
    diff, interval = paired_difference(
        a.sequence_numerators(tau_ms),
        a.seq_tokens,
        b.sequence_numerators(tau_ms)[idx],
        np.asarray(b.seq_tokens, float)[idx],
        seed,
    )
    return {
        "a": a.run,
        "b": b.run,
        "difference_ms": diff,
        "interval": interval,
        "told_apart": not interval[0] <= 0 <= interval[1],
    }


def point(report: dict, tau1_ms: float | None = None, path=None) -> MeasuredRun:
    """A run's measured point from its results file; priced with `tau1_ms` when given."""
    from moecache.policies import POLICIES

    totals = report.get("totals", {})
    missing = [key for key in TOTALS if key not in totals]
    rows = report.get("sequences", [])
    missing += [f"sequences[].{key}" for key in SEQUENCE_KEYS if rows and key not in rows[0]]
    if missing:
        where = f"{path}: " if path else f"run {report.get('run')}: "
        raise MoecacheError(
            f"{where}not a decode run's results as the cost model reads them "
            f"(no {', '.join(missing)})"
        )
    run = MeasuredRun(
        run=report["run"],
        policy=report["policy"],
        multiplier=report.get("multiplier", 1),
        delta_nll=totals["delta_nll"],
        restricts=POLICIES[report["policy"]].restricts,
        shard=report.get("shard"),
        **timing(totals, rows),
    )
    twin = report.get("twin_1x")
    if twin:  # the same run at 1x, decoded token by token beside it
        twin = dataclasses.replace(run, multiplier=1, **timing(twin["totals"], twin["sequences"]))
        run = dataclasses.replace(run, twin=twin)
    return run if tau1_ms is None else run.priced(tau1_ms)


def timing(totals: dict, rows: list) -> dict:
    """MeasuredRun's timing fields from a run's totals and per-sequence rows."""
    return {
        "step_ms": totals["step_ms"],
        "step_ms_ci": tuple(totals["step_ms_ci"]),
        "tokens_per_second": totals["tokens_per_second"],
        "tokens_per_second_ci": tuple(totals["tokens_per_second_ci"]),
        "rho": totals["rho"],
        "copies_per_token": totals["copies_per_token"],
        "copy_share": totals["copy_share"],
        "measured_compute_ms": totals["compute_ms"],
        "measured_compute_ms_ci": tuple(totals["compute_ms_ci"]),
        "sequences": tuple(r["sequence"] for r in rows),
        "seq_tokens": tuple(r["timed_tokens"] for r in rows),
        "seq_step_ms": tuple(1e3 * r["step_seconds"] for r in rows),
        "seq_copies": tuple(r["timed_copies"] for r in rows),
        "seq_copy_ms": tuple(1e3 * r["copy_seconds"] for r in rows),
    }


def read_points(paths, tau1_ms: float | None = None) -> list[MeasuredRun]:
    points = []
    for path in paths:
        report = read_run_dict(path)
        if report.get("multiplier") != 1:
            raise MoecacheError(
                f"{path}: the cost model reads 1x runs (this is x{report.get('multiplier')})"
            )
        points.append(point(report, tau1_ms, path))
    if not points:
        raise MoecacheError("no decode runs given")
    return points


# --- copy time from a bandwidth file --------------------------------------------------------


def tau_1x(bandwidth: dict) -> float:
    """This machine's time per copy at 1x, the per-group overhead apart."""
    return bandwidth.get("multipliers", {}).get("1", {}).get("tau_ms", bandwidth["tau_ms"])


def tau_at(bandwidth: dict, m, path=None, strict: bool = True) -> float:
    """tau(m): the time per copy measured through the link m times slower. Not strict:
    m * tau(1) where the file did not measure m."""
    key = f"{m:g}" if isinstance(m, float) else str(m)
    row = bandwidth.get("multipliers", {}).get(key)
    if row is not None:
        return row["tau_ms"]
    if m == 1:
        return tau_1x(bandwidth)
    if strict:
        raise MoecacheError(
            f"{path or 'the bandwidth file'}: no copy time measured at {key}x "
            f"(measured: {', '.join(bandwidth.get('multipliers', {})) or 'none'})"
        )
    return m * tau_1x(bandwidth)


# --- equation (1) against the runs repeated at slower copies ---------------------------------


def overlap(a, b) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def cost_rows(
    points: list[MeasuredRun], scaled: list[MeasuredRun], taus: dict
) -> tuple[list[dict], list[str]]:
    """One row per run repeated at a multiplier m > 1, predicted from its 1x twin (else
    its 1x run on the same sequences): n its copies per timed token, tau(1) the time per
    copy as the twin timed its own copies, c its step less those copies, and the predicted
    ms/token c + n m tau(1) (a link m times slower); the measured one with its interval, the
    relative error (predicted / measured - 1) and whether it is within 5%. `taus`: the
    bandwidth file's tau(m), shown beside (copies timed back to back, apart from a run's
    compute, need not cost what a run's own do). Also the scaled runs left out (no 1x run)."""
    by_run = {p.run: p for p in points}
    rows, orphans = [], []
    for s in sorted(scaled, key=lambda s: (s.multiplier, s.run)):
        base = s.twin or by_run.get(s.run)
        if base is None:
            orphans.append(f"{s.run} at {s.multiplier:g}x")
            continue
        base = base.on(s.sequences)  # the same sequences at 1x
        tau1 = base.own_tau_ms  # None: no copies, nothing for the link to slow
        own = base.priced(tau1 or 0.0)  # c from the run's own copy time
        c, predicted = own.compute_ms, own.ms_per_token(s.multiplier * (tau1 or 0.0))
        error = predicted / s.step_ms - 1
        rows.append(
            {
                "multiplier": s.multiplier,
                "run": s.run,
                "reference": "twin" if s.twin else "1x run",
                "n": base.n,
                "c_ms": c,
                "tau1_ms": tau1,
                "tau_ms": None if tau1 is None else s.multiplier * tau1,
                "tau_bandwidth_ms": taus.get(s.multiplier),
                "predicted_ms": predicted,
                "measured_ms": s.step_ms,
                "measured_ms_lo": s.step_ms_ci[0],
                "measured_ms_hi": s.step_ms_ci[1],
                "relative_error": error,
                "within_5pct": bool(abs(error) <= WITHIN),
            }
        )
    return rows, orphans


def winner_check(rows: list[dict]) -> list[dict]:
    """Per multiplier, from `cost_rows`: equation (1)'s predicted winner against the
    measured one, among the runs that make timed copies (a run with none, n = 0, costs
    the same at every multiplier: it cannot lose to slower copies and decides nothing);
    whether the measured winner's interval overlaps the runner-up's."""
    out = []
    for m, group in itertools.groupby(rows, key=lambda r: r["multiplier"]):
        group = list(group)
        contest = [r for r in group if r["n"] > 0]
        left_out = sorted(r["run"] for r in group if r["n"] <= 0)
        check = {"multiplier": m, "runs": sorted(r["run"] for r in contest), "left_out": left_out}
        if len(contest) < 2:
            out.append({**check, "agree": None})
            continue
        predicted = min(contest, key=lambda r: (r["predicted_ms"], r["run"]))
        measured = sorted(contest, key=lambda r: (r["measured_ms"], r["run"]))
        first, second = measured[0], measured[1]
        check.update(
            predicted_winner=predicted["run"],
            measured_winner=first["run"],
            runner_up=second["run"],
            agree=predicted["run"] == first["run"],
            told_apart=not overlap(
                (first["measured_ms_lo"], first["measured_ms_hi"]),
                (second["measured_ms_lo"], second["measured_ms_hi"]),
            ),
        )
        out.append(check)
    return out


def winner_lines(checks: list[dict], rows: list[dict]) -> list[str]:
    """The cost model's verdicts as lines: AGREE/DISAGREE per multiplier, the runs left
    out of the contest and why, whether the measured winner is told apart, and whether
    every run is within 5%."""
    lines = []
    for c in checks:
        m = f"{c['multiplier']:g}x"
        if c["agree"] is None:
            lines.append(
                f"At {m}: fewer than two runs make timed copies "
                f"({', '.join(c['runs']) or 'none'}); no winner to check."
            )
        else:
            lines.append(
                f"At {m}: equation (1) predicts {c['predicted_winner']}, measured fastest "
                f"{c['measured_winner']}: {'AGREE' if c['agree'] else 'DISAGREE'}."
            )
            if not c["told_apart"]:
                lines.append(
                    f"At {m}: the measured winner {c['measured_winner']} is not told apart from "
                    f"the runner-up {c['runner_up']} (their 95% intervals overlap)."
                )
        if c["left_out"]:
            lines.append(
                f"At {m}: left out of the winner check, making no timed copies (n = 0: "
                f"slower copies cannot slow them, so they cannot lose): {', '.join(c['left_out'])}."
            )
    if rows:
        worst = max(rows, key=lambda r: abs(r["relative_error"]))
        every = all(r["within_5pct"] for r in rows)
        lines.append(
            f"Every run within 5%: {'yes' if every else 'no'} (largest error "
            f"{100 * worst['relative_error']:+.1f}%, {worst['run']} at "
            f"{worst['multiplier']:g}x)."
        )
    return lines
