"""Training the scorers to imitate the oracle, with selection by validation loss.

A scorer's scores over one event's candidates are a softmax; the loss is the cross-entropy
with the oracle's victims (uniform over them when it evicts several at one token). Linear
and MLP scorers train on minibatches of events; the GRU on minibatches of whole streams,
since its score at t depends on the stream's history. Every `check` steps the validation
loss (held-apart sequences of the training data) is measured and the best weights kept.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from moecache.policies import learned_features as features
from moecache.policies.scorers import Scorer
from moecache.records.demand import Demand


@dataclass
class Data:
    """Features of every expert at every token, and the oracle's events over them."""

    x: torch.Tensor  # [T, S, N, F] float32
    lengths: torch.Tensor  # [S]
    t: torch.Tensor  # [E] token of each event
    s: torch.Tensor  # [E] stream (row of x) of each event
    candidates: torch.Tensor  # [E, C] expert ids, padded with 0
    valid: torch.Tensor  # [E, C] True at real candidates
    target: torch.Tensor  # [E, C] the oracle's victims, weights summing to 1

    @property
    def events(self) -> int:
        return len(self.t)

    def at_events(self, index: torch.Tensor) -> torch.Tensor:
        """[B, C, F] candidates' features at events `index`."""
        t, s = self.t[index, None], self.s[index, None]
        return self.x[t, s, self.candidates[index]]


def feature_table(demand: Demand, streams: list[int], feature_set: str) -> np.ndarray:
    """[T, S, N, F] features of `streams` (in that order), computed by stepping the rule's
    own Features through the demand, longest streams first as in replay."""
    order = sorted(range(len(streams)), key=lambda i: -demand.lengths[streams[i]])
    picked = np.array([streams[i] for i in order], dtype=np.int64)
    lengths = demand.lengths[picked]
    n_experts = demand.num_experts
    state = features.Features(feature_set, n_experts, len(picked))
    steps = int(lengths.max(initial=0))
    x = np.zeros((steps, len(picked), n_experts, state.width), dtype=np.float32)
    flat = np.arange(len(picked))[:, None] * n_experts
    for t in range(steps):
        n = int(np.count_nonzero(lengths > t))
        rows, chosen = slice(0, n), picked[:n]
        probs = demand.probs[chosen, t] if state.router else None
        x[t, :n] = state.at(t, rows, probs)
        state.observe(t, rows, demand.requests[chosen, t] + flat[:n], probs)
    back = np.argsort(order)
    return x[:, back]


@dataclass
class Table:
    """Features of some streams of a demand, computed once and shared by every dataset."""

    x: torch.Tensor  # [T, S, N, F]
    streams: list[int]  # the demand's stream index of each row
    lengths: torch.Tensor  # [S]

    @classmethod
    def of(cls, demand: Demand, streams: list[int], feature_set: str) -> Table:
        x = torch.from_numpy(feature_table(demand, streams, feature_set))
        return cls(x, list(streams), torch.from_numpy(demand.lengths[streams]))


def dataset(table: Table, events: pd.DataFrame, capacity: int) -> Data:
    row = {s: i for i, s in enumerate(table.streams)}
    chosen = events[events["stream"].isin(row)]
    count = len(chosen)
    candidates = np.zeros((count, capacity), dtype=np.int64)
    valid = np.zeros((count, capacity), dtype=bool)
    target = np.zeros((count, capacity), dtype=np.float32)
    pairs = zip(chosen["candidates"], chosen["victims"], strict=True)
    for i, (cands, victims) in enumerate(pairs):
        cands = np.asarray(cands)
        candidates[i, : len(cands)], valid[i, : len(cands)] = cands, True
        target[i, : len(cands)] = np.isin(cands, victims) / len(victims)
    return Data(
        table.x,
        table.lengths,
        torch.tensor(chosen["token"].to_numpy(), dtype=torch.long),
        torch.tensor([row[s] for s in chosen["stream"]], dtype=torch.long),
        torch.from_numpy(candidates),
        torch.from_numpy(valid),
        torch.from_numpy(target),
    )


def loss(scores: torch.Tensor, valid: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    logp = scores.masked_fill(~valid, float("-inf")).log_softmax(-1)
    return -(target * logp.masked_fill(~valid, 0.0)).sum(-1).mean()


def batch_loss(scorer: Scorer, data: Data, index: torch.Tensor) -> torch.Tensor:
    """Loss of events `index` (stateless scorers), or of every event of streams `index`
    (the GRU, which runs over those streams' whole history)."""
    if not scorer.recurrent:
        scores, _ = scorer.step(data.at_events(index), None)
        return loss(scores, data.valid[index], data.target[index])
    steps = int(data.lengths[index].max())
    scores, _ = scorer.sequence(data.x[:steps, index])  # [T, b, N]
    where = torch.full((len(data.lengths),), -1, dtype=torch.long)
    where[index] = torch.arange(len(index))
    mine = torch.nonzero(where[data.s] >= 0).squeeze(1)
    picked = scores[data.t[mine], where[data.s[mine]]]  # [E', N]
    return loss(picked.gather(1, data.candidates[mine]), data.valid[mine], data.target[mine])


def validation_loss(scorer: Scorer, data: Data) -> float:
    with torch.no_grad():
        everything = torch.arange(len(data.lengths) if scorer.recurrent else data.events)
        return float(batch_loss(scorer, data, everything))


def standardise(scorer: Scorer, data: Data) -> None:
    rows = data.at_events(torch.arange(data.events))[data.valid].double()
    scorer.mean.copy_(rows.mean(0))
    scorer.std.copy_(rows.std(0).clamp_min(1e-6))


def train(kind: str, feature_set: str, fit: Data, valid: Data, settings: dict, seed: int):
    """The scorer with the lowest validation loss seen, and how it was chosen."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    recurrent = kind == "gru"
    hidden = settings["gru_hidden"] if recurrent else settings["hidden"]
    scorer = Scorer(kind, feature_set, hidden)
    standardise(scorer, fit)
    optimiser = torch.optim.Adam(scorer.parameters(), lr=settings["lr"])
    steps = settings["gru_steps"] if recurrent else settings["steps"]
    size = settings["batch_streams"] if recurrent else settings["batch_events"]
    population = len(fit.lengths) if recurrent else fit.events
    start = time.monotonic()
    best = (validation_loss(scorer, valid), 0, copy.deepcopy(scorer.state_dict()))
    curve = [{"step": 0, "validation_loss": best[0]}]
    for step in range(1, steps + 1):
        index = torch.randperm(population, generator=generator)[:size]
        optimiser.zero_grad()
        value = batch_loss(scorer, fit, index)
        value.backward()
        optimiser.step()
        if step % settings["check_every"] == 0 or step == steps:
            current = validation_loss(scorer, valid)
            curve.append({"step": step, "train_loss": value.item(), "validation_loss": current})
            if current < best[0]:
                best = (current, step, copy.deepcopy(scorer.state_dict()))
    scorer.load_state_dict(best[2])
    summary = {
        "kind": kind,
        "feature_set": feature_set,
        "hidden": hidden,
        "steps": steps,
        "selected_step": best[1],
        "validation_loss": best[0],
        "initial_validation_loss": curve[0]["validation_loss"],
        "fit_events": fit.events,
        "validation_events": valid.events,
        "seconds": time.monotonic() - start,
        "curve": curve,
    }
    return scorer, summary


def as_rule(scorer: Scorer, demand: Demand, capacity: int):
    """The learned eviction rule running `scorer` (a float64 copy), without a file."""
    from moecache.policies.learned import Learned

    rule = Learned(capacity, demand.num_experts, demand.top_k, "(in memory)", scorer.feature_set)
    rule.scorer = copy.deepcopy(scorer).double().eval()
    return rule


def copies_after_fill(demand: Demand, rule) -> int:
    from moecache.replay import engine

    return int(engine.run(demand, rule).after_fill.sum())


def learn(kind, feature_set, demand, oracle, fit: Table, valid: Table, settings, seed, permute):
    """Train on the oracle's events, then for `dagger_rounds` rounds add the oracle's
    labels of the states the scorer itself reaches and train again (DAgger). With
    `permute`, every label is drawn at random among the same candidates (the control).
    Each round records the share of the gap its scorer recovers on the validation streams."""
    from moecache.learned import labels
    from moecache.records.demand import subset
    from moecache.replay import engine

    capacity = settings["capacity"]
    events, rounds, start = oracle, [], time.monotonic()
    # Each round's share of the gap on the validation streams; LRU and the oracle once.
    held = subset(demand, valid.streams)
    lru, best = (
        copies_after_fill(held, engine.make_rule(rule, held, capacity))
        for rule in ("lru", "farthest-future")
    )
    for round_ in range(settings["dagger_rounds"] + 1):
        used = labels.permuted(events, seed + round_) if permute else events
        scorer, summary = train(
            kind,
            feature_set,
            dataset(fit, used, capacity),
            dataset(valid, used, capacity),
            settings,
            seed + round_,
        )
        mine = copies_after_fill(held, as_rule(scorer, held, capacity))
        summary["validation_gap_recovered"] = engine.gap_recovered(lru, best, mine)
        rounds.append(summary)
        if round_ < settings["dagger_rounds"]:
            visited = labels.learner_events(demand, as_rule(scorer, demand, capacity))
            visited = visited[visited["stream"].isin(set(fit.streams) | set(valid.streams))]
            events = pd.concat([events, visited], ignore_index=True)
    # Seconds of the whole fit: every round's training, its validation replay and labels.
    seconds = time.monotonic() - start
    return scorer, {**rounds[-1], "seconds": seconds, "rounds": rounds, "permuted_labels": permute}
