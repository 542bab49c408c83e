"""What the scorecard's claims read of a run's results files, and how a claim's answer
is written down (`Found`); an input the run did not produce is `Missing`, a `not run` row.
Replay claims are read at the paper's ratio C = N/2 where the run replayed it
(`replay.capacities`), on the first shard replayed. The statistics that say whether a
claim's evidence can decide it (the `undecided` verdict) are in power.py."""

from __future__ import annotations

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
