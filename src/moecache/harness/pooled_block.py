"""The pooled MoE block: replaces `mlp` in a restricted layer of transformers' OLMoE.

It calls the model's own router (`self.gate`, so router logits are still recorded), reads
the router's output on the host once (the block's one host sync per token), asks its
policy for a plan, lets the pool copy, and computes the token with the model's own expert
kernel over the device slots, slot ids in place of expert ids. It knows nothing of which
policy drives it beyond `policy.restricts`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from moecache.harness.pool import ExpertPool
from moecache.model.kernel import PER_EXPERT


class PooledMoeBlock(nn.Module):
    def __init__(self, mlp, pool: ExpertPool, policy):
        super().__init__()
        self.gate = mlp.gate  # OlmoeTopKRouter: softmax in fp32, top-k, OLMoE's weights
        self.pool, self.policy = pool, policy
        self.top_k, self.num_experts = mlp.gate.top_k, mlp.gate.num_experts
        # The per-expert kernel reads the slot ids on the host: given there, the block's
        # own transfer of the routing is its one host sync per token and layer.
        host_ids = getattr(pool.kernel.config, "_experts_implementation", None) == PER_EXPERT
        self.send = Sender(self.top_k, pool.host.device, host_ids)
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
        router_logits, top_weights, top_index = self.gate(x)
        probs = torch.softmax(router_logits, dtype=torch.float, dim=-1)
        if x.device.type == "cpu":  # already on the host: no copy to make
            probs_host, index_host = probs.numpy(), top_index.numpy()
        else:  # one transfer, the block's one host sync
            on_host = torch.cat([probs, top_index.to(probs.dtype)], dim=-1).cpu().numpy()
            probs_host, index_host = on_host[:, : self.num_experts], on_host[:, self.num_experts :]
        dtype = router_logits.dtype
        requests = index_host.astype(np.int64).tolist()
        if len(x) == 1:  # decoding: one token
            out = self.token(x, probs_host[0], requests[0], top_weights, dtype)
        else:
            out = torch.cat(
                [
                    self.token(
                        x[i : i + 1], probs_host[i], requests[i], top_weights[i : i + 1], dtype
                    )
                    for i in range(len(x))
                ]
            )
        return out.reshape(batch, length, hidden)

    def token(self, x, probs: np.ndarray, request: list[int], top_weights, dtype) -> torch.Tensor:
        pool = self.pool
        plan = self.policy.plan(self.t, request, probs, pool.resident)
        if plan.admit or plan.evict:
            pool.apply(plan)
        if self.policy.restricts:
            # The top_k resident experts by the router's full softmax, not renormalised.
            resident = np.fromiter(pool.slot_of, dtype=np.int64)
            best = resident[np.argsort(-probs[resident], kind="stable")[: self.top_k]]
            used = best.tolist()
            slots, weights = self.send([pool.slot_of[e] for e in used], probs[best], dtype)
        else:
            used = request
            slots, weights = self.send([pool.slot_of[e] for e in used]), top_weights
        self.trace.append({"token": self.t, "requested": request, "used": used, "probs": probs})
        self.t += 1
        return pool.kernel(x, slots, weights)


class Sender:
    """Slot ids (and weights) of one token to the device without a host sync: through a
    pinned staging buffer on a GPU, whose previous copy the block's one sync has waited for.
    `host_ids`: the kernel reads the slot ids on the host, so they stay there."""

    def __init__(self, top_k: int, device: torch.device, host_ids: bool = False):
        self.device, self.cuda, self.host_ids = device, device.type == "cuda", host_ids
        if self.cuda:
            self.slots_host = torch.empty((1, top_k), dtype=torch.int64).pin_memory()
            self.weights_host = torch.empty((1, top_k), dtype=torch.float32).pin_memory()

    def __call__(self, slots: list[int], weights: np.ndarray | None = None, dtype=None):
        if not self.cuda:
            sent = torch.tensor([slots])
            return sent if weights is None else (sent, torch.from_numpy(weights)[None].to(dtype))
        if self.host_ids:
            sent = torch.tensor([slots])
        else:
            self.slots_host[0].copy_(torch.tensor(slots))
            sent = self.slots_host.to(self.device, non_blocking=True)
        if weights is None:
            return sent
        self.weights_host[0].copy_(torch.from_numpy(weights))
        return sent, self.weights_host.to(self.device, non_blocking=True).to(dtype)
