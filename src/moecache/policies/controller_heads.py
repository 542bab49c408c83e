"""The controller's two heads, one pair per restricted layer (not shared: each layer's
hidden states and experts differ). The termination head beta scores, at each token, whether
to replace the cached expert set; the selection head mu scores every expert, and a refresh
caches the C best. Both read the MoE block's input hidden state of the token. The heads and
their file are the rule's (policies/controller.py runs them); the controller stage trains
and writes them (controller/train.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from moecache.errors import MoecacheError


class Heads(nn.Module):
    def __init__(self, layers: list[int], hidden: int, num_experts: int):
        super().__init__()
        self.layers, self.hidden, self.num_experts = list(layers), hidden, num_experts
        self.beta = nn.ModuleDict({str(layer): nn.Linear(hidden, 1) for layer in layers})
        self.mu = nn.ModuleDict({str(layer): nn.Linear(hidden, num_experts) for layer in layers})

    def forward(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Termination probability [...] and selection scores [..., N] for hidden states
        x [..., H] of `layer`."""
        key = str(layer)
        return torch.sigmoid(self.beta[key](x)).squeeze(-1), self.mu[key](x)

    def decide(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """[T, 1 + N]: beta, then the selection scores, one row per token (for the host)."""
        beta, scores = self(layer, x.float())
        return torch.cat([beta[:, None], scores], dim=-1)


def save(heads: Heads, path: str | Path, meta: dict) -> None:
    shape = {"layers": heads.layers, "hidden": heads.hidden, "num_experts": heads.num_experts}
    tensors = {k: v.detach().contiguous() for k, v in heads.state_dict().items()}
    save_file(tensors, str(path), metadata={"shape": json.dumps(shape), "meta": json.dumps(meta)})


def load(path: str | Path) -> tuple[Heads, dict]:
    from safetensors import safe_open

    if not Path(path).is_file():
        raise MoecacheError(f"{path}: no controller heads file (moecache controller-train)")
    with safe_open(str(path), "pt") as f:
        header = f.metadata() or {}
    if "shape" not in header:
        raise MoecacheError(f"{path}: not a controller heads file (no shape in its metadata)")
    shape = json.loads(header["shape"])
    heads = Heads(shape["layers"], shape["hidden"], shape["num_experts"])
    heads.load_state_dict(load_file(str(path)))
    heads.eval()
    return heads, json.loads(header.get("meta", "{}"))
