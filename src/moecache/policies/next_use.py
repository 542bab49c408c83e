"""Next use: evict the resident least likely to be requested within the next few tokens.

A logistic model per layer gives the log-odds that expert e is requested in the `horizon`
tokens after t from what is known at t: which experts token t requested (`follow` [L, N, N],
co-activation learned once) and the router's log-probabilities over all experts at t
(`router` [L, N, N]: the experts the router nearly chose come next), plus `bias` [L, N].
`layers` [L] names the layer each model serves; the rule reads the model of its `layer`
(the harness sets it; replay of one layer's streams passes layer=<id>), or the only one.
The rule adds `coactivation` times the log of the co-activation rule's score
(policies/co_activation.py: what followed the recent tokens' experts in this very stream,
plus FLOOR_COACTIVATION) and `frequency` times the log of each
expert's use count decayed by `decay` per token, and evicts the lowest total, ties to the
least recently used, then the lowest id. The learned stage fits the model on its training
trace (learned/next_use.py) and writes `weights`, a safetensors file of the three arrays.
Causal: it reads requests up to t and the router's output for t.
"""

from __future__ import annotations

import numpy as np

from moecache.errors import MoecacheError
from moecache.policies.co_activation import CoActivation
from moecache.policies.eviction import EvictionPolicy

ARRAYS = ("follow", "router", "bias")  # each with a leading layer axis, beside "layers"
FLOOR = 1e-6  # log-probabilities and counts below it are read as it
FLOOR_COACTIVATION = 0.05  # an expert never seen to follow scores this, not minus infinity


class NextUse(EvictionPolicy):
    name = "next-use"
    by_default = False  # needs a trained file
    needs_probs = True

    def __init__(
        self,
        capacity,
        num_experts,
        top_k,
        weights: str = "",
        frequency: float = 0.3,
        decay: float = 0.9,
        layer: int | None = None,
        coactivation: float = 0.0,
    ):
        super().__init__(capacity, num_experts, top_k)
        if not weights:
            raise MoecacheError(f"policy {self.name}: needs weights=<model .safetensors file>")
        if frequency < 0 or coactivation < 0 or not 0 < decay < 1:
            raise MoecacheError(
                f"policy {self.name}: frequency {frequency} and coactivation {coactivation} "
                f"must not be negative, decay {decay} must lie in (0, 1)"
            )
        self.weights, self.frequency, self.decay = weights, frequency, decay
        self.layer, self.coactivation = layer, coactivation
        # The stream's own co-activation, read only when weighted (its state is N x N).
        self.follows = CoActivation(capacity, num_experts, top_k) if coactivation else None
        self.model = None  # loaded at the first reset: configs are checked before training

    def reset(self, future=None, streams=1):
        super().reset(future, streams)
        if self.model is None:
            self.model = load(self.weights, self.num_experts, self.layer)
        self.count = np.zeros((streams, self.num_experts))
        self.request = np.zeros((streams, self.num_experts))
        if self.follows:
            self.follows.reset(None, streams)

    def step(self, t, at, probs, pools):
        rows = slice(0, len(at))
        self.request[rows] = 0.0
        self.request.put(at, 1.0)  # token t's request, known before its victims
        if self.follows:
            self.follows.take_context(at)
        return super().step(t, at, probs, pools)

    def priority(self, t, rows, probs):
        follow, router, bias = (self.model[a] for a in ARRAYS)
        odds = self.request[rows] @ follow + np.log(np.maximum(probs, FLOOR)) @ router + bias
        odds += self.frequency * np.log(np.maximum(self.count[rows], FLOOR))
        if self.follows:
            follows = self.follows.priority(t, rows, probs)[0]
            odds += self.coactivation * np.log(follows + FLOOR_COACTIVATION)
        return odds, self.recency[rows]

    def learn(self, t, rows, at, probs):
        super().learn(t, rows, at, probs)
        self.count[rows] *= self.decay
        self.count.put(at, 1.0 + self.count.take(at))
        if self.follows:
            self.follows.learn(t, rows, at, probs)


def load(path: str, num_experts: int, layer: int | None) -> dict[str, np.ndarray]:
    """The arrays of `layer`'s model from `path` (None: its only one), checked against the
    layer's N experts."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        model = load_file(path)
    except (OSError, SafetensorError) as error:
        raise MoecacheError(f"{path}: not a readable next-use model ({error})") from None
    layers = model.get("layers", np.zeros(0, dtype=np.int64)).tolist()
    n = num_experts
    shapes = {
        "follow": (len(layers), n, n),
        "router": (len(layers), n, n),
        "bias": (len(layers), n),
    }
    for name, shape in shapes.items():
        if name not in model or model[name].shape != shape or not layers:
            raise MoecacheError(f"{path}: array {name!r} missing or not shaped {shape}")
    if layer is None and len(layers) > 1:
        raise MoecacheError(
            f"{path}: a model per layer ({len(layers)}); name the layer (replay: layer=<id>)"
        )
    if layer is not None and layer not in layers:
        raise MoecacheError(f"{path}: no model for layer {layer} (it has {layers})")
    at = 0 if layer is None else layers.index(layer)
    return {name: model[name][at].astype(np.float64) for name in ARRAYS}
