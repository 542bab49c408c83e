"""Fit the next-use rule's model (policies/next_use.py) on the training trace.

One multi-label logistic regression per layer (the streams named layer<L>/...): from token
t's request
(one-hot over N experts) and the router's log-probabilities at t, the log-odds that each
expert is requested within the next `horizon` tokens. Full-batch Adam on the mean binary
cross-entropy with a small L2 penalty, seeded from the config; the last token of each stream
(no future) is left out. With `standardise` the inputs are standardised for the fit (the
one-hot columns and the log-probabilities, down to log FLOOR, differ in scale by an order of
magnitude, which can leave Adam oscillating) and the scaling is folded back into the
weights, so the rule reads raw inputs either way; whether to is a choice the causal study
makes on validation sequences (learned/causal.py). `permute` shuffles the labels across
tokens (same seed): the control, whose rule must do no better than chance features.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moecache.policies.next_use import FLOOR
from moecache.records.batch import layer_number
from moecache.records.demand import Demand, subset


def examples(demand: Demand, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs [rows, 2N] (request one-hot, router log-probabilities) and labels [rows, N]
    (requested within the next `horizon` tokens), one row per token but each stream's last."""
    n = demand.num_experts
    inputs, labels = [], []
    for s, length in enumerate(demand.lengths.tolist()):
        onehot = np.zeros((length, n))
        np.put_along_axis(onehot, demand.requests[s, :length], 1.0, axis=1)
        seen = np.vstack([np.zeros((1, n)), np.cumsum(onehot, axis=0)])
        t = np.arange(length - 1)
        ahead = seen[np.minimum(t + horizon, length - 1) + 1] - seen[t + 1]
        router = np.log(np.maximum(demand.probs[s, : length - 1], FLOOR))
        inputs.append(np.hstack([onehot[:-1], router]))
        labels.append(ahead > 0)
    return np.vstack(inputs), np.vstack(labels).astype(np.float64)


def layer_ids(demand: Demand) -> dict[int, list[int]]:
    """Layer id -> its streams' indices (a stream "layer<L>/<sequence>"; else layer 0)."""
    out: dict[int, list[int]] = {}
    for s, name in enumerate(demand.streams):
        out.setdefault(layer_number(name) or 0, []).append(s)
    return dict(sorted(out.items()))


def fit(
    demand: Demand,
    horizon: int,
    steps: int,
    lr: float,
    l2: float,
    seed: int,
    permute=False,
    standardise=True,
):
    """The model of every layer (follow, router, bias stacked; layers) and a summary."""
    models, losses = [], {}
    for layer, streams in layer_ids(demand).items():
        part = subset(demand, streams)
        model, loss = fit_layer(part, horizon, steps, lr, l2, seed, permute, standardise)
        models.append(model)
        losses[str(layer)] = loss
    stacked = {name: np.stack([m[name] for m in models]) for name in ("follow", "router", "bias")}
    stacked["layers"] = np.array(list(layer_ids(demand)), dtype=np.int64)
    summary = {
        "rows": int((demand.lengths - 1).sum()),
        "horizon": horizon,
        "standardise": standardise,
        "steps": steps,
        "final_loss": losses,
        "permuted": permute,
    }
    return stacked, summary


def fit_layer(
    demand: Demand, horizon, steps, lr, l2, seed, permute, standardise
) -> tuple[dict, float]:
    """One layer's model: full-batch Adam on its examples; its last loss."""
    import torch

    x, y = examples(demand, horizon)
    if permute:
        y = y[np.random.default_rng(seed).permutation(len(y))]
    torch.manual_seed(seed)
    mean, scale = np.zeros(x.shape[1]), np.ones(x.shape[1])
    if standardise:
        mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-6  # a constant column keeps weight 0
    inputs = torch.from_numpy((x - mean) / scale).float()
    labels = torch.from_numpy(y).float()
    n = demand.num_experts
    weight = torch.zeros(2 * n, n, requires_grad=True)
    bias = torch.zeros(n, requires_grad=True)
    optimiser = torch.optim.Adam([weight, bias], lr=lr)
    loss_fn = torch.nn.functional.binary_cross_entropy_with_logits
    for _ in range(steps):
        optimiser.zero_grad()
        loss = loss_fn(inputs @ weight + bias, labels) + l2 * (weight**2).sum()
        loss.backward()
        optimiser.step()
    w = weight.detach().numpy().astype(np.float64) / scale[:, None]  # weights of raw inputs
    b = bias.detach().numpy().astype(np.float64) - mean @ w
    model = {"follow": w[:n], "router": w[n:], "bias": b}
    return model, float(loss.item())


def save(model: dict, path, summary: dict) -> None:
    """The arrays in a safetensors file, the summary (as JSON text) in its metadata."""
    import json

    from safetensors.numpy import save_file

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: np.ascontiguousarray(v) for k, v in model.items()},
        str(path),
        {"summary": json.dumps(summary)},
    )
