"""Intervals over sequences: percentile bootstraps that resample whole sequences (numpy
only, so that the report can use them without importing torch)."""

from __future__ import annotations

import numpy as np

from moecache.errors import MoecacheError

BOOTSTRAP_RESAMPLES = 2000


def bootstrap_ratio(numerators, denominators, seed: int, level: float = 0.95):
    """Percentile bootstrap interval of sum(numerators) / sum(denominators), resampling the
    pairs (one pair a sequence): the spread of a per-token rate over the sequences."""
    num, den = np.asarray(numerators, float), np.asarray(denominators, float)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(num), size=(BOOTSTRAP_RESAMPLES, len(num)))
    sums = den[picks].sum(axis=1)
    # A resample whose denominator is 0 has no ratio (e.g. retention where the resampled
    # questions were all missed by the reference): it is left out, not counted as one.
    ratios = num[picks].sum(axis=1)[sums != 0] / sums[sums != 0]
    if not len(ratios):
        return [float("nan"), float("nan")]
    tail = (1 - level) / 2
    return [float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1 - tail))]


def paired_difference(num_a, den_a, num_b, den_b, seed: int = 0, level: float = 0.95):
    """sum(num_a)/sum(den_a) - sum(num_b)/sum(den_b) and its percentile bootstrap interval,
    resampling the same sequences for both (row i of a and of b: one sequence)."""
    num_a, den_a = np.asarray(num_a, float), np.asarray(den_a, float)
    num_b, den_b = np.asarray(num_b, float), np.asarray(den_b, float)
    if not (len(num_a) == len(den_a) == len(num_b) == len(den_b)) or not len(num_a):
        raise MoecacheError("a paired difference needs the same sequences on both sides")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(num_a), size=(BOOTSTRAP_RESAMPLES, len(num_a)))
    diffs = num_a[picks].sum(axis=1) / den_a[picks].sum(axis=1) - num_b[picks].sum(axis=1) / den_b[
        picks
    ].sum(axis=1)
    tail = (1 - level) / 2
    point = float(num_a.sum() / den_a.sum() - num_b.sum() / den_b.sum())
    return point, [float(np.quantile(diffs, tail)), float(np.quantile(diffs, 1 - tail))]
