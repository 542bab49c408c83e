"""Fit the next-use rule's model (policies/next_use.py) on the training trace.

One multi-label logistic regression, shared by the layers: from token t's request
(one-hot over N experts) and the router's log-probabilities at t, the log-odds that each
expert is requested within the next `horizon` tokens. Full-batch Adam on the mean binary
cross-entropy with a small L2 penalty, seeded from the config; the last token of each stream
(no future) is left out. `permute` shuffles the labels across tokens (same seed): the
control, whose rule must do no better than chance features.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moecache.policies.next_use import FLOOR
from moecache.records.demand import Demand


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


def fit(demand: Demand, horizon: int, steps: int, lr: float, l2: float, seed: int, permute=False):
    """The model's arrays (follow, router, bias) and a summary of the fit."""
    import torch

    x, y = examples(demand, horizon)
    if permute:
        y = y[np.random.default_rng(seed).permutation(len(y))]
    torch.manual_seed(seed)
    inputs, labels = torch.from_numpy(x).float(), torch.from_numpy(y).float()
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
    w = weight.detach().numpy().astype(np.float64)
    model = {"follow": w[:n], "router": w[n:], "bias": bias.detach().numpy().astype(np.float64)}
    summary = {
        "rows": len(x),
        "horizon": horizon,
        "steps": steps,
        "final_loss": float(loss.item()),
        "permuted": permute,
    }
    return model, summary


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
