"""The oracle's choices: replay farthest-future on a recorded trace and keep, at every
token where it evicts, the resident candidates (never an expert that token requests) and
the experts it evicted, with each candidate's next use. The replay's FarthestFuture is
the one oracle; nothing here re-implements it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moecache.atomic import atomic_file
from moecache.errors import MoecacheError
from moecache.policies.eviction import EvictionPolicy
from moecache.records.demand import PAD, Demand
from moecache.replay import engine

COLUMNS = ["stream", "name", "sequence", "token", "candidates", "victims", "next_use"]


def next_use(demand: Demand) -> np.ndarray:
    """[streams, T, N]: the first token after t that requests each expert (-1: none)."""
    streams, steps, _ = demand.requests.shape
    out = np.full((streams, steps, demand.num_experts), -1, dtype=np.int64)
    ahead = np.full((streams, demand.num_experts), -1, dtype=np.int64)
    rows = np.arange(streams)[:, None]
    for t in range(steps - 1, -1, -1):
        out[:, t] = ahead
        request = demand.requests[:, t]
        valid = request != PAD
        ahead[np.broadcast_to(rows, request.shape)[valid], request[valid]] = t
    return out


def oracle_events(demand: Demand, capacity: int) -> pd.DataFrame:
    """One row per (stream, token) at which farthest-future evicts."""
    oracle = engine.make_rule("farthest-future", demand, capacity)
    counts = engine.run(demand, oracle, keep=True)
    return events_of(demand, counts, lambda s, t, candidates, m: None)


def events_of(demand: Demand, counts: engine.Counts, label) -> pd.DataFrame:
    """One row per (stream, token) with evictions in a replay kept with `keep`: the
    candidates, the victims (`label(s, t, candidates, m)`, or the replay's own when it
    gives None) and each candidate's next use."""
    upcoming = next_use(demand)
    rows = []
    for s, t in zip(*np.nonzero(counts.evictions.any(axis=2)), strict=True):
        requested = np.zeros(demand.num_experts, dtype=bool)
        requested[demand.requests[s, t]] = True
        candidates = np.flatnonzero(counts.residents[s, t - 1] & ~requested)
        victims = np.flatnonzero(counts.evictions[s, t])
        if not set(victims) <= set(candidates):
            raise MoecacheError(f"{demand.streams[s]} token {t}: a victim was not a candidate")
        chosen = label(s, t, candidates, len(victims))
        if chosen is not None:
            victims = np.sort(chosen)
        rows.append(
            {
                "stream": int(s),
                "name": demand.streams[s],
                "sequence": demand.sequences[s],
                "token": int(t),
                "candidates": candidates.tolist(),
                "victims": victims.tolist(),
                "next_use": upcoming[s, t, candidates].tolist(),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def write(events: pd.DataFrame, path) -> None:
    with atomic_file(path) as tmp:
        events.to_parquet(tmp, index=False)


def read(path) -> pd.DataFrame:
    from pathlib import Path

    if not Path(path).is_file():
        raise MoecacheError(f"{path}: no labels (the labels rule writes them)")
    return pd.read_parquet(path)


def permuted(events: pd.DataFrame, seed: int) -> pd.DataFrame:
    """The control's labels: at every event as many victims as the oracle's, drawn at
    random from the same candidates."""
    rng = np.random.default_rng(seed)
    out = events.copy()
    out["victims"] = [
        sorted(rng.choice(c, size=len(v), replace=False).tolist())
        for c, v in zip(events["candidates"], events["victims"], strict=True)
    ]
    return out


class Imitation(EvictionPolicy):
    """Follows `learner`'s evictions and asks `oracle` (farthest-future) at each one, so
    that the oracle labels the states the learner itself reaches (DAgger)."""

    def __init__(self, learner: EvictionPolicy, oracle: EvictionPolicy):
        super().__init__(learner.capacity, learner.num_experts, learner.top_k)
        self.learner, self.oracle = learner, oracle
        self.needs_future, self.needs_probs = True, learner.needs_probs

    def reset(self, future=None, streams=1):
        super().reset(future, streams)
        self.learner.reset(None, streams)
        self.oracle.reset(future, streams)
        self.asked: dict[int, np.ndarray] = {}

    def priority(self, t, rows, probs):
        self.asked[t] = np.array(self.oracle.priority(t, rows, probs))
        return self.learner.priority(t, rows, probs)

    def learn(self, t, rows, at, probs):
        self.learner.learn(t, rows, at, probs)
        self.oracle.learn(t, rows, at, probs)
        super().learn(t, rows, at, probs)


def learner_events(demand: Demand, learner: EvictionPolicy) -> pd.DataFrame:
    """Events of the learner's own trajectory, each labelled with the oracle's choice of
    as many victims as the learner evicted there."""
    oracle = engine.make_rule("farthest-future", demand, learner.capacity)
    imitation = Imitation(learner, oracle)
    counts = engine.run(demand, imitation, keep=True)
    # run() steps the streams longest first: row i of a priority call is stream order[i].
    row_of = np.argsort(np.argsort(-demand.lengths, kind="stable"))
    return events_of(
        demand,
        counts,
        lambda s, t, candidates, m: candidates[
            np.lexsort((candidates, imitation.asked[t][row_of[s], candidates]))[:m]
        ],
    )
