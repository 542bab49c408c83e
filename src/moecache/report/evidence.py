"""What the scorecard's claims read of a run's results files, and how a claim's answer
is written down (`Found`); an input the run did not produce is `Missing`, a `not run` row.
Replay claims are read at the paper's ratio C = N/2 where the run replayed it
(`replay.capacities`), on the first shard replayed. Its last section, power, holds the
statistics that say whether a claim's evidence can decide it (the `undecided` verdict)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from moecache.records.accuracy import AccuracySummary
from moecache.records.io import read_dict, read_record, read_replay, read_run
from moecache.records.learned import LearnedEvaluation
from moecache.records.replay import BY_NAME
from moecache.records.router_tuning import TunedModel
from moecache.records.run import RunResult
from moecache.report import replayed
from moecache.runs import at_multiplier

PAPER_RATIO = 0.5  # C / N in the paper: 32 of 64 experts resident
PAPER_MODEL = "OLMoE-1B-7B"  # NLL and accuracy sizes compare only on the paper's model
HOLDS, DIFFERS, NOT_COMPARABLE, NOT_RUN = "holds", "differs", "not comparable", "not run"
# The evidence is too small to decide the claim (its premise fails, or its interval is not
# narrower than the tolerance needs): never holds or differs then (issue 48).
UNDECIDED = "undecided"
VERDICTS = (HOLDS, DIFFERS, UNDECIDED, NOT_COMPARABLE, NOT_RUN)  # the order they are tallied


# Results files whose `settings` say what config the run used (Results.settings), and the
# record each holds.
STAMPED = (
    ("results/runs/{shard}/*.json", RunResult),
    ("results/controller/sweep/*/*.json", RunResult),
    ("results/router_tuning/measured/*.json", TunedModel),
    ("results/learned/evaluation.json", LearnedEvaluation),
    ("results/accuracy/*/summary.json", AccuracySummary),
)


def stamped_settings(path: Path, kind) -> dict:
    """The settings a results file stamps, read as its record `kind`."""
    if kind is RunResult:
        return read_run(path).settings
    return read_record(path, kind).settings


class Missing(Exception):
    """An input of a claim that this run did not produce."""


@dataclass
class Found:
    value: str  # this run's value, as the row shows it
    verdict: str
    setting: str = ""
    why: str = ""
    sources: list[str] = field(default_factory=list)
    elsewhere: list[str] = field(default_factory=list)  # the same at other capacities


def near(x: float, target: float, tolerance: float) -> bool:
    """Within the tolerance; a hair of float rounding at its edge counts as within."""
    return abs(x - target) <= tolerance + 1e-9


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

    def settings(self) -> dict | None:
        """The config this run used, section by section as its results files stamp it (a
        stage's files stamp the sections it read): the decode runs' first, then the
        controller's, the router tuning's, the learned rules' and the accuracy's; None
        where no results file here records any."""
        merged = {}
        shard = self.shards[0] if self.shards else "*"
        for pattern, kind in STAMPED:
            found = sorted(self.workdir.glob(pattern.format(shard=shard)))
            if not found:
                continue
            for section, value in stamped_settings(found[0], kind).items():
                merged.setdefault(section, value)
        return merged or None

    def trace_sequences(self, settings: dict) -> int | None:
        """How many sequences the trace run decoded on the first shard (its record)."""
        label = f"{settings['harness']['trace_run']}-x1.json"
        path = self.workdir / "results/runs" / (self.shards[0] if self.shards else "") / label
        return len(read_run(path).sequences_decoded) if path.exists() else None

    def path(self, relative: str) -> str:
        return str(self.workdir / relative)

    def read(self, relative: str, what: str, kind) -> tuple[dict, str]:
        """A results file as its dict, read through records/io as `kind`, the record it
        holds."""
        path = self.workdir / relative
        if not path.exists():
            raise Missing(f"no {what} ({relative})")
        return read_dict(path, kind), relative

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
            experts = read_replay(found[0][2]).experts
            paper = [row for row in found if row[1] == PAPER_RATIO * experts]
            _, capacity, path = (paper or found)[0]
            wanted = path.with_name(f"{name}.json")
            if not wanted.exists():
                raise Missing(f"no {name} at C = {capacity} ({wanted.name})")
            relative = wanted.relative_to(self.workdir).as_posix()
            return read_dict(wanted, BY_NAME[name]), relative, bool(paper)
        raise Missing("no replay results")

    def others(self, name: str, path: str) -> list[tuple[int, dict, str]]:
        """(C, report, file) of `name` at every other capacity replayed beside `path`."""
        shard = replayed.shard_of(path)
        return [
            (capacity, read_dict(found, BY_NAME[name]), found.relative_to(self.workdir).as_posix())
            for _, capacity, found in replayed.found(self.workdir, name, [shard])
            if found.relative_to(self.workdir).as_posix() != path
        ]


def at_capacity(report: dict, paper_ratio: bool, path: str) -> tuple[str, str]:
    """The setting a replay claim was read at, and why it is not comparable (or '')."""
    n = report.get("experts")
    setting = f"C = {report['capacity']}" + (f" of {n}" if n else "")
    setting += f", shard {replayed.shard_of(path)}"
    why = "" if paper_ratio else "no replay at the paper's C = N/2 (replay.capacities)"
    return setting, why


def judged(ok: bool, why: str, too_small: str = "") -> str:
    """Not comparable where `why` says so, else undecided where `too_small` says why the
    evidence cannot decide, else holds or differs."""
    if why:
        return NOT_COMPARABLE
    return UNDECIDED if too_small else verdict(ok)


def joined(*reasons: str) -> str:
    return "; ".join(filter(None, reasons))


@dataclass
class Run:
    run: str
    policy: str
    params: dict
    restricts: bool
    overlapped: bool
    tokens_per_second: float
    delta_nll: float
    rho: float
    sequences: int  # how many sequences it decoded
    path: str = ""  # its results file, relative to the run folder


def runs_1x(r: Results, overlapped: bool = False) -> tuple[list[Run], list[str]]:
    """Every blocking run at 1x on the first shard (`overlapped`: every overlapped one
    instead): what the claims read of it. Overlapped runs decode fewer sequences and time
    their copies otherwise, so a claim never compares the two kinds by accident."""
    shard = r.shards[0] if r.shards else "*"
    paths = r.glob(f"results/runs/{shard}/{at_multiplier(1)}", "runs at 1x")
    runs, kept = [], []
    for path in paths:
        result = read_run(r.path(path))
        if result.overlapped != overlapped:
            continue
        t = result.totals
        runs.append(
            Run(
                result.run,
                result.policy,
                result.params,
                result.restricts,
                result.overlapped,
                t["tokens_per_second"],
                t["delta_nll"],
                t["rho"],
                len(result.sequences_decoded),
                path,
            )
        )
        kept.append(path)
    if not runs:
        kind = "overlapped" if overlapped else "blocking"
        raise Missing(f"no {kind} runs at 1x (results/runs/{shard})")
    return runs, kept


def model_why(r: Results, paths: list[str]) -> str:
    """Why NLL sizes do not compare: the model is not the paper's (or '')."""
    for path in paths:
        run = read_run(r.path(path))
        source = run.settings["model"]["source"]
        if PAPER_MODEL not in source:
            return f"model {source}, base NLL {run.base_nll:.2f}: NLL sizes are not the paper's"
    return ""


# ------------------------------------------------------------------------ power
# Whether a claim's evidence is large enough to decide it (issue 48 point 1), computed from
# the run's own numbers: a training log's trend with its 95% interval (did a tuned router
# learn? did the controller's heads stop learning?), a proportion's interval against a level
# (does free routing answer above chance?), and the size at which an interval would clear a
# threshold at the scatter this run measured. The claim checks turn these into the
# `undecided` verdict and its reason.

Z95 = 1.96
# A plateau: over the last half of training the objective moves, by its whole 95%
# interval, less than this share of what training lowered it by (first to last quarter).
PLATEAU_SHARE = 0.10
LARGEST = 10**7  # sizes beyond this are reported as such, not searched for


def whole(size: float) -> int:
    """A size rounded up to a whole count, a float's hair above an integer not counting."""
    return math.ceil(round(size, 6))


def t95(df: int) -> float:
    """Two-sided 95% quantile of Student's t with `df` degrees of freedom (scipy's)."""
    from scipy import stats

    return math.inf if df < 1 else float(stats.t.ppf(0.975, df))


@dataclass(frozen=True)
class Trend:
    """A per-step series: the means of its first and last quarter (what a training log's
    summary shows), and its least-squares slope a step with a 95% t interval (the scatter
    about the line is its noise)."""

    steps: int
    start: float
    end: float
    slope: float
    low: float
    high: float
    scatter: float  # residual standard deviation about the line

    @property
    def rises(self) -> bool:
        return self.low > 0

    @property
    def falls(self) -> bool:
        return self.high < 0

    def text(self, digits: int = 3) -> str:
        d = digits
        return (
            f"{self.start:.{d}f} -> {self.end:.{d}f} over {self.steps} steps, slope "
            f"{self.slope:+.{d}f} a step [{self.low:+.{d}f}, {self.high:+.{d}f}]"
        )


def spread(steps: int) -> float:
    """The sum of squares of 0..steps-1 about their mean: a slope's precision."""
    return steps * (steps * steps - 1) / 12


def trend(values) -> Trend | None:
    """The trend of `values` (one a step); None under 3 steps (no noise to measure)."""
    from scipy import stats

    y = [float(v) for v in values]
    n = len(y)
    if n < 3:
        return None
    fit = stats.linregress(range(n), y)
    slope, scatter = float(fit.slope), float(fit.stderr) * math.sqrt(spread(n))
    half = t95(n - 2) * float(fit.stderr)
    q = max(1, n // 4)
    start, end = sum(y[:q]) / q, sum(y[-q:]) / q
    return Trend(n, start, end, slope, slope - half, slope + half, scatter)


def steps_to_show(found: Trend) -> int | None:
    """Steps at which a slope of this size would clear 0 at this scatter, in its own
    direction (None: the slope is 0, so no length of training shows one)."""
    if found.slope == 0:
        return None

    def clears(n: int) -> bool:
        return t95(n - 2) * found.scatter / math.sqrt(spread(n)) < abs(found.slope)

    # A slope's half-width falls as n^-3/2: start at the normal's answer, walk up.
    n = max(3, math.ceil((12 * (Z95 * found.scatter / abs(found.slope)) ** 2) ** (1 / 3)))
    while not clears(n) and n < LARGEST:
        n += max(1, n // 50)
    return n


@dataclass(frozen=True)
class Plateau:
    """Whether a training objective (lower is better) reached a plateau: it fell beyond
    its noise over the whole log, and over the last half its change (slope times the
    half's steps) lies, by its whole 95% interval, within PLATEAU_SHARE of that fall."""

    whole: Trend
    tail: Trend
    tolerance: float  # the change the last half may show: PLATEAU_SHARE of the fall

    @property
    def change(self) -> tuple[float, float]:
        span = self.tail.steps - 1
        return self.tail.low * span, self.tail.high * span

    @property
    def reached(self) -> bool:
        low, high = self.change
        return self.whole.falls and -self.tolerance <= low and high <= self.tolerance

    def steps_needed(self) -> int | None:
        """Steps of training whose last half would show a plateau at this scatter, were
        the objective flat there (None: it did not fall beyond its noise, so there is no
        fall to measure a plateau against)."""
        if not self.whole.falls or self.tolerance <= 0:
            return None

        def clears(m: int) -> bool:
            return t95(m - 2) * self.tail.scatter * (m - 1) / math.sqrt(spread(m)) <= (
                self.tolerance
            )

        m = 3
        while not clears(m) and m < LARGEST:
            m += max(1, m // 20)
        return 2 * m


def plateau(values) -> Plateau | None:
    """The plateau test of a per-step objective; None under 6 steps (a half of 3)."""
    values = list(values)
    whole, tail = trend(values), trend(values[len(values) - len(values) // 2 :])
    if whole is None or tail is None:
        return None
    return Plateau(whole, tail, PLATEAU_SHARE * max(whole.start - whole.end, 0.0))


def questions_to_clear(share: float, level: float) -> int | None:
    """Questions at which a proportion `share` has a 95% normal interval above `level`
    (None: it is not above the level, so no number of questions puts it there)."""
    if share <= level:
        return None
    return whole(Z95**2 * share * (1 - share) / (share - level) ** 2)


def pairs_to_tell_apart(scatter: float, gap: float) -> int | None:
    """Paired items (questions, sequences) at which a mean difference `gap` with per-item
    standard deviation `scatter` has a 95% interval clear of 0."""
    if gap == 0:
        return None
    return max(2, whole((Z95 * scatter / abs(gap)) ** 2))


def size_to_clear(size: int, estimate: float, interval, threshold: float) -> int | None:
    """The size (sequences) at which `interval`, measured on `size`, would clear
    `threshold` on the side `estimate` lies (an interval narrows as one over the root of
    the size); None where the estimate sits on the threshold."""
    low, high = interval
    distance = abs(estimate - threshold)
    if distance == 0:
        return None
    facing = estimate - low if estimate > threshold else high - estimate
    return whole(size * (facing / distance) ** 2)


def straddles(interval, threshold: float) -> bool:
    low, high = interval
    return low <= threshold <= high


def about(size: int | None) -> str:
    """A size as the reasons show it."""
    if size is None:
        return "no size"
    return f"more than {LARGEST:,}" if size >= LARGEST else f"about {size:,}"
