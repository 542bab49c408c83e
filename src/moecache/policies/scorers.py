"""The scorers: a linear map, a two-layer MLP and a small GRU over each expert's history.

Each scores every expert from its features at token t; the rule evicts the resident with
the highest score. The GRU keeps a hidden state per expert, updated at every token from
that token's features, so its score at t summarises the expert's whole history. Features
are standardised with the training data's mean and deviation, kept in the weights file.
The networks and their files are the rule's (policies/learned.py reads them); the learned
stage trains and writes them (learned/fit.py, stage.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from moecache.errors import MoecacheError
from moecache.policies import learned_features as features

KINDS = ("linear", "mlp", "gru")


class Scorer(nn.Module):
    def __init__(self, kind: str, feature_set: str, hidden: int = 32):
        super().__init__()
        if kind not in KINDS:
            raise MoecacheError(f"scorer {kind!r}: known kinds are {', '.join(KINDS)}")
        width = len(features.names(feature_set))
        self.kind, self.feature_set, self.hidden = kind, feature_set, hidden
        self.register_buffer("mean", torch.zeros(width, dtype=torch.float64))
        self.register_buffer("std", torch.ones(width, dtype=torch.float64))
        if kind == "linear":
            self.head = nn.Linear(width, 1)
        elif kind == "mlp":
            self.head = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        else:
            # One GRU over time: training runs whole sequences through its fused loop,
            # inference one token at a time (a length-1 sequence is one cell step).
            self.rnn = nn.GRU(width, hidden)
            self.head = nn.Linear(hidden + width, 1)

    @property
    def recurrent(self) -> bool:
        return self.kind == "gru"

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / self.std).to(self.head_dtype)

    @property
    def head_dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def step(self, x: torch.Tensor, state: torch.Tensor | None):
        """Scores [...] of features x [..., F] at one token, and the GRU's next state."""
        if not self.recurrent:
            return self.head(self.normalise(x)).squeeze(-1), None
        scores, states = self.sequence(x[None], state)
        return scores[0], states

    def sequence(self, x: torch.Tensor, state: torch.Tensor | None = None):
        """Scores [T, ...] of a whole sequence of features [T, ..., F] (and, for the GRU,
        its state after the last token)."""
        z = self.normalise(x)
        if not self.recurrent:
            return self.head(z).squeeze(-1)
        steps, shape = z.shape[0], z.shape[1:-1]
        flat = z.reshape(steps, -1, z.shape[-1])
        h0 = None if state is None else state.reshape(1, -1, self.hidden)
        h, last = self.rnn(flat, h0)
        scores = self.head(torch.cat([h, flat], dim=-1)).reshape(steps, *shape)
        return scores, last.reshape(*shape, self.hidden)


def save(scorer: Scorer, path, about: dict) -> None:
    """Weights in safetensors; kind, feature set, width and `about` (how it was trained) in
    the file's metadata."""
    metadata = {
        "kind": scorer.kind,
        "feature_set": scorer.feature_set,
        "hidden": str(scorer.hidden),
        "about": json.dumps(about, sort_keys=True),
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous() for k, v in scorer.state_dict().items()}
    save_file(tensors, str(path), metadata=metadata)


def load(path, feature_set: str | None = None) -> Scorer:
    """A scorer from its safetensors file, in float64 for inference (so that a decision
    does not depend on how many streams are scored together)."""
    from safetensors import SafetensorError, safe_open

    if not Path(path).is_file():
        raise MoecacheError(f"{path}: no scorer weights (the learned stage trains them)")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        kind, stored_set = metadata["kind"], metadata["feature_set"]
        hidden = int(metadata["hidden"])
    except (KeyError, ValueError, OSError, SafetensorError) as error:
        raise MoecacheError(f"{path}: not a scorer weights file ({error})") from None
    if feature_set is not None and stored_set != feature_set:
        raise MoecacheError(f"{path}: trained on {stored_set} features, not {feature_set}")
    scorer = Scorer(kind, stored_set, hidden)
    try:
        scorer.load_state_dict(load_file(str(path)))
    except RuntimeError as error:
        raise MoecacheError(f"{path}: weights do not fit a {kind} scorer ({error})") from None
    return scorer.double().eval()


def about(path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return json.loads((handle.metadata() or {}).get("about", "{}"))
