"""A learned scorer as an eviction rule: evict the resident it scores highest.

`weights` names a safetensors file of a scorer (policies/scorers.py) written by the learned
stage; `features` must be the set it was trained on ("past-use", or "router", which also
reads the router's probabilities). The same object runs in trace replay and in the harness,
inside the measured step, so its decisions and its cost are those of every other rule.
"""

from __future__ import annotations

import numpy as np

from moecache.errors import MoecacheError
from moecache.policies import learned_features as feature_sets
from moecache.policies.eviction import EvictionPolicy


class Learned(EvictionPolicy):
    name = "learned"
    by_default = False

    def __init__(self, capacity, num_experts, top_k, weights: str = "", features: str = "router"):
        super().__init__(capacity, num_experts, top_k)
        if not weights:
            raise MoecacheError(f"policy {self.name}: needs weights=<scorer .safetensors file>")
        feature_sets.names(features)
        self.weights, self.feature_set = weights, features
        self.needs_probs = features == "router"
        self.scorer = None  # loaded at the first reset: configs are checked before training

    def reset(self, future=None, streams=1):
        from moecache.policies import scorers

        super().reset(future, streams)
        if self.scorer is None:
            self.scorer = scorers.load(self.weights, self.feature_set)
        self.features = feature_sets.Features(self.feature_set, self.num_experts, streams)
        self.state = None  # the GRU's hidden state per stream and expert
        self.scored = None  # (t, scores, next state) of the last token scored

    def score(self, t, rows, probs):
        import torch  # here, not at import: the registry (and trace replay) runs without it

        if self.scored is None or self.scored[0] != t:
            x = torch.from_numpy(self.features.at(t, rows, probs))
            state = None if self.state is None else self.state[rows]
            with torch.no_grad():
                scores, after = self.scorer.step(x, state)
            # Rounded to float32: experts with equal features tie exactly, whatever the rows
            # scored together (float64's last bits depend on them), and go to the tie-break.
            self.scored = (t, scores.numpy().astype(np.float32), after)
        return self.scored[1]

    def priority(self, t, rows, probs):
        # Highest score first; ties to the least recently used, then the lowest id.
        return -self.score(t, rows, probs), self.recency[rows]

    def learn(self, t, rows, at, probs):
        self.score(t, rows, probs)  # a recurrent scorer steps at every token
        after = self.scored[2]
        if after is not None:
            import torch

            if self.state is None:
                shape = (*self.features.peak.shape, after.shape[-1])
                self.state = torch.zeros(shape, dtype=after.dtype)
            self.state[rows] = after
        self.features.observe(t, rows, at, probs)
        super().learn(t, rows, at, probs)
