"""The names of runs, controller heads and sweep points: built and parsed here only.

A run's results are named `<run>-x<multiplier>` (`lru-x10`: the config's run `lru` with
copies 10 times slower), a controller's heads `<objective>-s<seed>[-e<price>]`, and a
sweep point `t<100 * threshold>` (`t50`). The workflow builds its paths from these and
the stages read them back through `parse`, so a name has one spelling.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from moecache.errors import MoecacheError

# A run's name as the config spells it (harness.runs); the workflow's wildcards use these.
RUN_PATTERN = r"[a-z0-9][a-z0-9-]*"
LABEL_PATTERN = rf"{RUN_PATTERN}-x[0-9]+"
HEADS_PATTERN = r"(?:differentiable|reinforce)-s[0-9]+(?:-e[0-9.]+)?"
POINT_PATTERN = r"t[0-9]+|reference"


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


def point_name(threshold: float) -> str:
    """A sweep point's name: threshold 0.5 -> t50."""
    return f"t{round(100 * threshold)}"


def threshold_of(point: str, thresholds: list[float]) -> float:
    """The threshold of `thresholds` that `point` names (t50 -> 0.5)."""
    found = [t for t in thresholds if point_name(t) == point]
    if not found:
        raise NameFormatError(f"{point}: not one of controller.thresholds")
    return found[0]
