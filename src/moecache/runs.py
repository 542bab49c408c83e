"""The names of runs, controller heads and sweep points: built and parsed here only.

A run's results are named `<run>-x<multiplier>` (`lru-x10`: the config's run `lru` with
copies 10 times slower; a scaled run's 1x twin `lru-twin-x1`), a controller's heads
`<objective>-s<seed>[-e<price>]`, a sweep point `t<100 * threshold>` (`t50`), and an
accuracy row of the controller `controller-s<seed>-<point>` (`matched` or a sweep
point), and a batched decoding's shape `b<B>-<batching>-p<prefill>` (`b4-static-p0`).
The workflow builds its paths from these and the stages read them back through `parse`,
so a name has one spelling.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from moecache.errors import MoecacheError

# A run's name as the config spells it (harness.runs); the workflow's wildcards use these.
RUN_PATTERN = r"[a-z0-9][a-z0-9-]*"
LABEL_PATTERN = rf"{RUN_PATTERN}-x[0-9]+"
HEADS_PATTERN = r"(?:differentiable|reinforce)-s[0-9]+(?:-e[0-9.]+)?"
POINT_PATTERN = r"t[0-9]+|reference"
ACCURACY_ROW_PATTERN = r"controller-s([0-9]+)-(matched|t[0-9]+)"
BATCHINGS = ("static", "continuous")
SHAPE_PATTERN = rf"b([0-9]+)-({'|'.join(BATCHINGS)})-p([0-9]+)"


class NameFormatError(MoecacheError):
    """A name that does not follow its pattern."""


def _match(pattern: str, text: str, what: str) -> re.Match:
    found = re.fullmatch(pattern, text)
    if found is None:
        raise NameFormatError(f"{text!r} is not a {what} name")
    return found


@dataclass(frozen=True)
class RunName:
    """One run of harness.runs at one copy multiplier."""

    run: str
    multiplier: int = 1

    def __str__(self) -> str:
        return f"{self.run}-x{self.multiplier}"

    @classmethod
    def parse(cls, label: str) -> RunName:
        found = _match(rf"({RUN_PATTERN})-x([0-9]+)", label, "run")
        return cls(found[1], int(found[2]))

    @classmethod
    def of(cls, path: str | Path) -> RunName:
        """The run a results file, trace or sweep folder is named after
        (results/runs/a/lru-x10.json: lru at 10x)."""
        return cls.parse(Path(path).stem)

    @property
    def twin(self) -> RunName:
        """The 1x twin a scaled run decodes beside (lru-x10 -> lru-twin-x1)."""
        return RunName(f"{self.run}-twin")


def at_multiplier(multiplier: int, suffix: str = ".json") -> str:
    """The glob of every run's file at `multiplier` (`*-x1.json`); suffix "" for the
    controller sweep's folders."""
    return f"*-x{multiplier}{suffix}"


@dataclass(frozen=True)
class HeadsName:
    """One controller heads file: objective x seed, priced at `price` when set."""

    objective: str
    seed: int
    price: float | None = None

    def __str__(self) -> str:
        name = f"{self.objective}-s{self.seed}"
        return name if self.price is None else f"{name}-e{self.price:g}"

    @classmethod
    def parse(cls, name: str) -> HeadsName:
        _match(HEADS_PATTERN, name, "controller heads")
        objective, rest = name.split("-s", 1)
        seed, _, price = rest.partition("-e")
        return cls(objective, int(seed), float(price) if price else None)


@dataclass(frozen=True)
class SweepRunName:
    """One run of the controller sweep: `heads` at sweep point `point`
    (`differentiable-s0-e0.005-t40`); the sweep's simple runs (`dwell-16`) are not."""

    heads: HeadsName
    point: str

    def __str__(self) -> str:
        return f"{self.heads}-{self.point}"

    @property
    def threshold(self) -> float:
        return int(self.point[1:]) / 100

    @classmethod
    def parse(cls, name: str) -> SweepRunName | None:
        """The heads and point of a controller run; None for a simple policy's run."""
        found = re.fullmatch(rf"({HEADS_PATTERN})-(t[0-9]+)", name)
        return None if found is None else cls(HeadsName.parse(found[1]), found[2])


@dataclass(frozen=True)
class AccuracyRowName:
    """One accuracy row of the controller: `seed`'s heads at `point` (matched: the
    threshold matching the switch rate; else a sweep point, t50)."""

    seed: int
    point: str

    def __str__(self) -> str:
        return f"controller-s{self.seed}-{self.point}"

    @classmethod
    def parse(cls, name: str) -> AccuracyRowName:
        found = _match(ACCURACY_ROW_PATTERN, name, "controller accuracy row")
        return cls(int(found[1]), found[2])


@dataclass(frozen=True)
class BatchShape:
    """How a batched run decodes: B sequences at once, static or continuous batching,
    each sequence's first `prefill` tokens in one forward (results/batched/<shard>/<shape>/)."""

    size: int
    batching: str = "static"
    prefill: int = 0

    def __str__(self) -> str:
        return f"b{self.size}-{self.batching}-p{self.prefill}"

    @classmethod
    def parse(cls, name: str) -> BatchShape:
        found = _match(SHAPE_PATTERN, name, "batch shape")
        return cls(int(found[1]), found[2], int(found[3]))


def batch_shapes(sizes: list[int], batched: dict) -> list[BatchShape]:
    """Every shape harness.batched decodes: each size x batching x prefill, prefill with
    static batching only (continuous batching has no common prompt step)."""
    return [
        BatchShape(size, batching, prefill)
        for size in sizes
        for batching in batched["batching"]
        for prefill in batched["prefill"]
        if batching == "static" or prefill == 0
    ]


def point_name(threshold: float) -> str:
    """A sweep point's name: threshold 0.5 -> t50."""
    return f"t{round(100 * threshold)}"


def threshold_of(point: str, thresholds: list[float]) -> float:
    """The threshold of `thresholds` that `point` names (t50 -> 0.5)."""
    found = [t for t in thresholds if point_name(t) == point]
    if not found:
        raise NameFormatError(f"{point}: not one of controller.thresholds")
    return found[0]
