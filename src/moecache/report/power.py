"""Whether a scorecard claim's evidence is large enough to decide it (issue 48 point 1),
computed from the run's own numbers: a training log's trend with its 95% interval (did a
tuned router learn? did the controller's heads stop learning?), a proportion's interval
against a level (does free routing answer above chance?), and the size at which an interval
would clear a threshold at the scatter this run measured. The claim checks
(report/claim_checks/) turn these into the `undecided` verdict and its reason."""

from __future__ import annotations

import math
from dataclasses import dataclass

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
