"""The rewards, computed with the project's one LRU (replay.engine over demand streams).

Hit rate (variants `hit`, `tag`): the routing of prompt + completion at one layer, taken
from a teacher-forced pass of the model being trained, replayed through a `capacity`-slot
LRU that starts empty at the prompt's first token. The reward is the mean, over the
completion's tokens, of the share of a token's top-k experts already resident before the
token: a completion whose every expert is already cached scores 1.0. The prompt's tokens
only warm the cache (they are the same for every completion of a group).

Harness copies (variant `harness`): the harness's own count at every restricted layer and
the harness's capacity, steady copies (a pool's fills left out until it has been full
once, as the harness splits them) over the whole teacher-forced text, per token; the
reward is minus that, the paper's rho. Lossless LRU never changes routing, so this replay
of the model's own routing gives the harness's count (tests/test_replay.py).
"""

from __future__ import annotations

import numpy as np

from moecache.records.demand import Demand, padded
from moecache.replay import engine


def routing(model, sequences: list[list[int]], layers: list[int], device: str) -> dict:
    """requests[layer][i]: the top-k experts [T, k] of sequence i at `layer`, teacher-forced
    through `model` (a peft model is read through its base model, adapters active)."""
    from moecache.learned import trace

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    requests = {layer: [[] for _ in sequences] for layer in layers}
    for row in trace.record(inner, sequences, layers, device):
        requests[row["layer"]][row["sequence"]].append(row["requested"])
    return {
        layer: [np.asarray(r, dtype=np.int64) for r in rows] for layer, rows in requests.items()
    }


def lru_counts(streams: list[np.ndarray], capacity: int, num_experts: int, keep: bool):
    names = [f"stream-{i}" for i in range(len(streams))]
    requests, lengths = padded(streams, streams[0].shape[1])
    demand = Demand(names, names, requests, lengths, num_experts)
    return engine.run(demand, engine.make_rule("lru", demand, capacity), keep=keep), requests


def hit_rates(
    streams: list[np.ndarray], starts: list[int], capacity: int, num_experts: int
) -> np.ndarray:
    """Per stream: the mean share of each token's experts resident before it, over tokens
    from `starts[i]` (at least 1: the first token meets an empty cache) to the end."""
    counts, requests = lru_counts(streams, capacity, num_experts, keep=True)
    k = requests.shape[2]
    rates = np.zeros(len(streams))
    for s, stream in enumerate(streams):
        t = np.arange(max(starts[s], 1), len(stream))
        if len(t) == 0:
            continue
        hits = counts.residents[s, t - 1][np.arange(len(t))[:, None], requests[s, t]]
        rates[s] = hits.sum() / (k * len(t))
    return rates


def copies_per_token(requests: dict, capacity: int, num_experts: int) -> np.ndarray:
    """Per sequence: steady copies of every layer in `requests`, per token after the first."""
    layers = list(requests)
    lengths = np.array([len(r) for r in requests[layers[0]]])
    streams = [r for layer in layers for r in requests[layer]]
    counts, _ = lru_counts(streams, capacity, num_experts, keep=False)
    steady = counts.steady.reshape(len(layers), len(lengths)).sum(axis=0)
    return steady / np.maximum(lengths - 1, 1)


class CacheReward:
    """A reward function as trl's GRPOTrainer calls it. `kind`: `hit` (a fixed capacity),
    `tag` (the capacity each prompt's tag names) or `harness` (the harness's copies).
    `model` is the trainer's (set once the trainer exists): the reward reads the routing
    of the policy being trained. Every call also logs `sim_hit_rate`, the hit rate at the
    trained layer and capacity, which all variants' training logs share."""

    def __init__(self, kind: str, tok, settings: dict):
        self.kind, self.tok, self.model = kind, tok, None
        self.__name__ = f"{kind}_reward"
        self.tuning, harness = settings["router_tuning"], settings["harness"]
        self.experts = settings["model"]["architecture"]["num_experts"]
        self.layers, self.capacity = harness["restricted_layers"], harness["capacity"]
        self.device = harness["device"]

    def __call__(self, prompts, completions, completion_ids, log_metric=None, **_):
        from moecache.router_tuning.prompts import tagged_size

        prompt_ids = self.tok(text=prompts)["input_ids"]
        sequences = [[*p, *c] for p, c in zip(prompt_ids, completion_ids, strict=True)]
        starts = [len(p) for p in prompt_ids]
        layer = self.tuning["layer"]
        layers = self.layers if self.kind == "harness" else [layer]
        requests = routing(self.model, sequences, sorted({*layers, layer}), self.device)
        trained = hit_rates(requests[layer], starts, self.tuning["capacity"], self.experts)
        if log_metric is not None:
            log_metric("sim_hit_rate", float(trained.mean()))
        if self.kind == "harness":
            at = {lay: requests[lay] for lay in self.layers}
            return (-copies_per_token(at, self.capacity, self.experts)).tolist()
        if self.kind == "hit":
            return trained.tolist()
        sizes = [tagged_size(p) for p in prompts]
        rewards = np.zeros(len(sequences))
        for size in set(sizes):
            pick = [i for i, s in enumerate(sizes) if s == size]
            rates = hit_rates(
                [requests[layer][i] for i in pick], [starts[i] for i in pick], size, self.experts
            )
            rewards[pick] = rates
        return rewards.tolist()
