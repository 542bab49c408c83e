"""The expert kernel the embedded default runs: per-expert matmuls on the weights of each
expert a token chose, registered with transformers' experts interface as `per-expert`.

transformers' `grouped_mm` falls back on a CPU to one matmul per expert of the layer, even
for experts no token chose, and `eager` builds masks over all of them; at batch 1 both
spend most of a token's time on experts it does not use. The model's own block and the
pooled block both run this kernel when `model.experts_implementation` names it (the pooled
block with slot ids in place of expert ids), so their speeds compare the same arithmetic.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

PER_EXPERT = "per-expert"


def per_expert_forward(self, hidden_states, top_k_index, top_k_weights):
    """The experts interface's contract: hidden [T, H], index and weights [T, k]. The
    pooled block calls it directly with the index already on the host, as lists."""
    out = torch.zeros_like(hidden_states)
    # The routing on the host, read once.
    index = top_k_index if isinstance(top_k_index, list) else top_k_index.tolist()
    if len(index) == 1:  # decoding: one token, its k experts in the router's order
        for j, e in enumerate(index[0]):
            out += top_k_weights[0, j] * expert(self, e, hidden_states)
        return out
    rows: dict[int, list[tuple[int, int]]] = {}
    for t, chosen in enumerate(index):
        for j, e in enumerate(chosen):
            rows.setdefault(e, []).append((t, j))
    for e, pairs in rows.items():
        tokens, slots = (torch.tensor(v, device=out.device) for v in zip(*pairs, strict=True))
        y = expert(self, e, hidden_states[tokens]) * top_k_weights[tokens, slots, None]
        out.index_add_(0, tokens, y.to(out.dtype))
    return out


def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
    """Expert `e` of a fused experts module, in the layout its class declares to
    transformers' experts interface (transposed or not, with biases or not) and through its
    own gate (`_apply_gate`: chunked SiLU for most families, GPT-OSS's clamped interleave).
    Experts kept as stored (quantized.py) are dequantized here, this one only, in x's dtype."""
    if getattr(type(self), "dequantized", None) is not None:
        gate_up, gate_up_bias, down, down_bias = self.dequantized(e, x.dtype)
    else:
        gate_up, gate_up_bias = self.gate_up_proj[e], bias(self, "gate_up_proj_bias", e)
        down, down_bias = self.down_proj[e], bias(self, "down_proj_bias", e)
    return project(self._apply_gate(project(x, gate_up, gate_up_bias, self)), down, down_bias, self)


def project(x: torch.Tensor, weight: torch.Tensor, b, experts) -> torch.Tensor:
    if experts.is_transposed:  # [in, out], as GPT-OSS stores it
        return x @ weight if b is None else x @ weight + b
    return F.linear(x, weight, b)


def bias(experts, name: str, e: int):
    return getattr(experts, name)[e] if experts.has_bias else None


ALL_EXPERTS_FUNCTIONS.register(PER_EXPERT, per_expert_forward)
