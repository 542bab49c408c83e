"""The pooled MoE block: replaces `mlp` in a restricted layer of transformers' OLMoE.

It calls the model's own router (`self.gate`, so router logits are still recorded), asks
its policy for a plan, lets the pool copy, and computes the token from the device slots.
It knows nothing of which policy drives it beyond `policy.restricts`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from moecache.harness.pool import ExpertPool


class PooledMoeBlock(nn.Module):
    def __init__(self, mlp, pool: ExpertPool, policy, act_fn):
        super().__init__()
        self.gate = mlp.gate  # OlmoeTopKRouter: softmax in fp32, top-k, OLMoE's weights
        self.pool, self.policy, self.act_fn = pool, policy, act_fn
        self.top_k = mlp.gate.top_k
        self.t, self.trace = 0, []

    def reset(self, future=None) -> None:
        """A new sequence: empty pool, fresh policy state (`future`: its recorded demand)."""
        self.pool.reset()
        self.policy.reset(future)
        self.t = 0
        self.trace: list[dict] = []

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = hidden_states.shape
        x = hidden_states.reshape(-1, hidden)
        router_logits, _, _ = self.gate(x)
        probs = torch.softmax(router_logits, dtype=torch.float, dim=-1)
        out = torch.stack([self.token(x[i], probs[i]) for i in range(len(x))])
        return out.reshape(batch, length, hidden)

    def token(self, x: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        top = torch.topk(probs, self.top_k)
        request = top.indices.tolist()
        probs_host = probs.cpu().numpy()
        self.pool.apply(self.policy.plan(self.t, request, probs_host, self.pool.resident))
        if self.policy.restricts:
            resident = np.fromiter(self.pool.slot_of, dtype=np.int64)
            best = resident[np.argsort(-probs_host[resident], kind="stable")[: self.top_k]]
            used, weights = best.tolist(), probs[torch.from_numpy(best).to(probs.device)]
        else:
            used, weights = request, top.values
        self.trace.append(
            {"token": self.t, "requested": request, "used": used, "probs": probs_host}
        )
        self.t += 1
        # All chosen experts at once: gather their slots, two batched matmuls, weighted sum.
        slots = torch.tensor([self.pool.slot_of[e] for e in used], device=x.device)
        gate, up = (self.pool.gate_up.index_select(0, slots) @ x).chunk(2, dim=-1)
        hidden = (self.act_fn(gate) * up).unsqueeze(-1)
        out = (self.pool.down.index_select(0, slots) @ hidden).squeeze(-1)
        return weights.to(x.dtype) @ out
