"""Causal features of every expert at token t, for many streams at once.

At token t a rule may read the history of tokens before t and the router's output for t
(it is computed before any copy). `Features.at(t, rows, probs)` gives [n, N, F] for the
streams in `rows`; `observe` then learns token t's request. The learned rule and training
call the same two methods, so the features a scorer trains on are those it runs on. They
are part of the rule (policies/learned.py), so they live here, below the learned stage that
trains on them (policies import no stage).
"""

from __future__ import annotations

import numpy as np

from moecache.errors import MoecacheError

COUNT_DECAYS = (0.5, 0.8, 0.9, 0.95, 0.99)
PROB_DECAYS = (0.5, 0.9)
MAX_DECAY = 0.9

PAST_USE = (
    "log time since last use",
    "never used",
    *(f"use count decayed {r}" for r in COUNT_DECAYS),
    "log uses",
    "log last interval",
    "log mean interval",
    "log overdue (time since last use / mean interval)",
    "log position",
)
ROUTER = (
    "router probability now",
    "log router probability now",
    "router rank now / N",
    *(f"router probability decayed {r}" for r in PROB_DECAYS),
    "router trend (fast - slow average)",
    f"router recent maximum (decayed {MAX_DECAY})",
)
SETS = {"past-use": PAST_USE, "router": PAST_USE + ROUTER}


def names(kind: str) -> tuple[str, ...]:
    if kind not in SETS:
        raise MoecacheError(f"feature set {kind!r}: known sets are {', '.join(SETS)}")
    return SETS[kind]


class Features:
    def __init__(self, kind: str, num_experts: int, streams: int):
        self.kind, self.router = kind, kind == "router"
        self.width = len(names(kind))
        shape = (streams, num_experts)
        self.last = np.full(shape, -1.0)  # token of the last use
        self.first = np.full(shape, -1.0)
        self.previous = np.full(shape, -1.0)  # token of the use before the last
        self.uses = np.zeros(shape)
        self.counts = np.zeros((len(COUNT_DECAYS), *shape))
        self.averages = np.zeros((len(PROB_DECAYS), *shape))
        self.peak = np.zeros(shape)

    def at(self, t: int, rows: slice, probs: np.ndarray | None) -> np.ndarray:
        """[n, N, F]: history before token t; router probabilities `probs` [n, N] of t."""
        last, uses = self.last[rows], self.uses[rows]
        never = last < 0
        since = np.where(never, t + 1, t - last)
        seen_twice = uses >= 2
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = np.where(seen_twice, (last - self.first[rows]) / (uses - 1), 0.0)
            overdue = np.where(seen_twice, since / mean, 0.0)
        interval = np.where(seen_twice, last - self.previous[rows], 0.0)
        columns = [
            np.log1p(since),
            never.astype(float),
            *self.counts[:, rows],
            np.log1p(uses),
            np.log1p(interval),
            np.log1p(mean),
            np.log1p(overdue),
            np.full(last.shape, np.log1p(t)),
        ]
        if self.router:
            if probs is None:
                raise MoecacheError("router features need the router's probabilities")
            p = np.asarray(probs, dtype=float)
            rank = np.argsort(np.argsort(-p, axis=1, kind="stable"), axis=1, kind="stable")
            averages = [
                r * a + (1 - r) * p
                for r, a in zip(PROB_DECAYS, self.averages[:, rows], strict=True)
            ]
            columns += [
                p,
                np.log(p + 1e-6),
                rank / p.shape[1],
                *averages,
                averages[0] - averages[-1],
                np.maximum(p, MAX_DECAY * self.peak[rows]),
            ]
        return np.stack(columns, axis=-1)

    def observe(self, t: int, rows: slice, at: np.ndarray, probs: np.ndarray | None) -> None:
        """Token t requested the flat indices `at` [n, k] (row * N + expert) of these rows."""
        for r, counts in zip(COUNT_DECAYS, self.counts, strict=True):
            counts[rows] *= r
            counts.reshape(-1).put(at, counts.reshape(-1).take(at) + 1.0)
        last = self.last.reshape(-1)
        self.previous.reshape(-1).put(at, last.take(at))
        first = self.first.reshape(-1)
        first.put(at, np.where(first.take(at) < 0, t, first.take(at)))
        last.put(at, t)
        self.uses.reshape(-1).put(at, self.uses.reshape(-1).take(at) + 1)
        if self.router:
            p = np.asarray(probs, dtype=float)
            for r, averages in zip(PROB_DECAYS, self.averages, strict=True):
                averages[rows] = r * averages[rows] + (1 - r) * p
            self.peak[rows] = np.maximum(p, MAX_DECAY * self.peak[rows])
