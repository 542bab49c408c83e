"""The learned controller as a restricting policy (the paper's "Learned"): at each token
its termination head gives beta, and when beta exceeds `threshold` the cache is replaced
by the C experts its selection head scores highest (ties to the lower id); between
refreshes the router chooses among the cached experts, as for Dwell and Static.

`weights` names a heads file written by `moecache controller-train`. Both heads run in the
pooled block's forward (decide), inside the timed step. Unlike the scheduled policies, the
controller keeps its cached set across sequences: a sequence starts by filling the pool
with the set the last one ended with (the harness's untimed first-token fill), unless the
first token's beta replaces it.
"""

from __future__ import annotations

import numpy as np

from moecache.errors import MoecacheError
from moecache.policies.policy import Policy, PoolChange


class Controller(Policy):
    name = "controller"
    restricts = True
    needs_hidden = True
    by_default = False  # needs a trained heads file

    def __init__(self, capacity, num_experts, top_k, weights: str = "", threshold: float = 0.5):
        super().__init__(capacity, num_experts, top_k)
        if not weights:
            raise MoecacheError(f"policy {self.name}: needs weights=<heads .safetensors file>")
        if not 0 < threshold < 1:
            raise MoecacheError(f"policy {self.name}: threshold {threshold} not in (0, 1)")
        self.weights, self.threshold = weights, threshold
        self.heads = None  # loaded at the first reset: configs are checked before training
        self.cached: list[int] | None = None  # kept across sequences
        self.row = None

    def reset(self, future=None, streams: int = 1) -> None:
        super().reset(future, streams)
        if self.heads is None:
            from moecache.policies import controller_heads as heads

            self.heads, _ = heads.load(self.weights)
            if self.layer not in self.heads.layers:
                raise MoecacheError(
                    f"policy {self.name}: {self.weights} has no heads for layer {self.layer}"
                )
            if self.heads.num_experts != self.num_experts:
                raise MoecacheError(
                    f"policy {self.name}: heads for {self.heads.num_experts} experts, "
                    f"the model has {self.num_experts}"
                )

    def decide(self, x):
        import torch

        if self.heads.beta[str(self.layer)].weight.device != x.device:
            self.heads.to(x.device)  # loaded on the host; moved once, before the first token
        with torch.no_grad():
            return self.heads.decide(self.layer, x)

    def see(self, row) -> None:
        self.row = row

    def change(self, t, request, probs, resident) -> PoolChange:
        beta, scores = float(self.row[0]), np.asarray(self.row[1:])
        refresh = self.cached is None or beta > self.threshold
        if refresh:
            best = np.argsort(-scores, kind="stable")[: self.capacity]
            self.cached = sorted(int(e) for e in best)
        return self.cache_to(self.cached, resident, refresh=refresh)
