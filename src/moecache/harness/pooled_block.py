"""The pooled MoE block: replaces the sparse block of a restricted layer, any family.

It calls the model's own router through the family's adapter (so router logits are still
recorded), reads the router's output on the host once (the block's one host sync per
token), asks its policy for the pool's change, lets the pool copy, and computes the token with the
model's own expert kernel over the device slots, slot ids in place of expert ids; the
family's shared experts, never offloaded, are added as the model adds them. Restricted
routing is the adapter's: the model's own selection among the resident experts. It knows
nothing of which policy drives it beyond `policy.restricts`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from moecache import gpu
from moecache.harness.pool import ExpertPool
from moecache.harness.timing import Stopwatch
from moecache.model.adapter import allowed_mask
from moecache.model.kernel import PER_EXPERT, per_expert_forward

STEP_FIELDS = ("token", "requested", "used", "copied", "refreshed", "decide_seconds", "probs")


class PooledMoeBlock(nn.Module):
    def __init__(self, mlp, pool: ExpertPool, policy, adapter):
        super().__init__()
        # The model's own block, kept out of this module's parameters (its experts are
        # offloaded); its router and shared experts are registered, they stay on the device.
        object.__setattr__(self, "own", mlp)
        self.adapter = adapter
        self.gate = adapter.router(mlp)
        self.always_resident = nn.ModuleList(adapter.shared_modules(mlp))
        self.pool, self.policy = pool, policy
        self.top_k, self.num_experts = adapter.top_k(mlp), pool.num_experts
        self.reads_probs = policy.needs_probs or policy.restricts
        # The per-expert kernel reads the slot ids on the host: given there, the block's
        # own transfer of the routing is its one host sync per token and layer.
        host_ids = getattr(pool.kernel.config, "_experts_implementation", None) == PER_EXPERT
        self.send = Sender(self.top_k, pool.host.device, host_ids)
        self.watch = Stopwatch(pool.host.device) if policy.needs_hidden else None
        self.t, self.trace = 0, []

    def reset(self, future=None) -> None:
        """A new sequence: empty pool, fresh policy state (`future`: its recorded demand)."""
        self.pool.reset()
        self.policy.reset(future)
        self.t = 0
        self.trace: list[tuple] = []  # one tuple of STEP_FIELDS per token: see steps()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = hidden_states.shape
        x = hidden_states.reshape(-1, hidden)
        router_logits, top_weights, top_index = self.adapter.route(self.own, x)
        dtype = router_logits.dtype  # the model's: the weights sent to the kernel take it
        decided, lap = None, None
        if self.watch is not None:  # the policy's own heads, inside the timed step
            self.watch.start()
            decided = self.policy.decide(x)
            lap = self.watch.lap()
        n, k = self.num_experts, self.top_k
        if not gpu.cuda_path(x.device):  # already on the host: no copy to make
            requests = top_index.tolist()
            # Probabilities now only for a policy that reads them; for the others the trace
            # keeps the logits, and steps() takes their softmax once decoding is over.
            probs = self.probabilities(router_logits).numpy() if self.reads_probs else None
            decided = None if decided is None else decided.numpy()
        else:  # one transfer, the block's one host sync
            probs = self.probabilities(router_logits)
            parts = [probs, top_index.to(probs.dtype), router_logits.float()]
            on_host = torch.cat(parts + ([] if decided is None else [decided]), dim=-1).cpu()
            requests = on_host[:, n : n + k].to(torch.int64).tolist()
            router_logits = on_host[:, n + k : 2 * n + k]  # restricted routing reads them
            decided = None if decided is None else on_host[:, 2 * n + k :].numpy()
            probs = on_host[:, :n].numpy()
        if len(x) == 1:  # decoding: one token
            first = None if probs is None else probs[0]
            if decided is not None:
                self.policy.see(decided[0])
            out = self.token(x, first, requests[0], top_weights, dtype, router_logits, lap)
        else:  # a whole sequence teacher-forced (lm-eval): token by token, as decoding
            out = []
            for i in range(len(x)):
                if decided is not None:
                    self.policy.see(decided[i])
                p = None if probs is None else probs[i]
                w, logits = top_weights[i : i + 1], router_logits[i : i + 1]
                out.append(self.token(x[i : i + 1], p, requests[i], w, dtype, logits))
            out = torch.cat(out)
        shared = self.adapter.shared(self.own, x)
        if shared is not None:  # always resident: the model adds them to the routed output
            out = out + shared
        return self.adapter.output(out.reshape(batch, length, hidden), top_weights)

    def token(
        self, x, probs, request: list[int], top_weights, dtype, logits, lap=None
    ) -> torch.Tensor:
        """One token; `probs` its softmax over all experts (None: the policy reads none),
        `logits` its router logits [1, N], `lap` the timer of the policy's decide()."""
        pool = self.pool
        change = self.policy.change(self.t, request, probs, pool.resident)
        if change.admit or change.evict:
            pool.apply(change)
        used, slots, weights = self.chosen(request, top_weights, dtype, logits)
        kept = logits if probs is None else probs
        self.trace.append((self.t, request, used, len(change.admit), change.refresh, lap, kept))
        self.t += 1
        if self.send.host_ids:  # the per-expert kernel itself, given the slot ids as a list
            return per_expert_forward(pool.kernel, x, slots, weights)
        return pool.kernel(x, slots, weights)

    def chosen(self, request: list[int], top_weights, dtype, logits):
        """(experts used, their slot ids and weights as the kernel takes them): the request,
        or for a restricting policy the model's own selection among the residents."""
        pool = self.pool
        if not self.policy.restricts:
            return request, self.send([pool.slot_of[e] for e in request]), top_weights
        # The model's own selection among the resident experts (the adapter's).
        weights, index = self.restrict(logits, pool.resident)
        used = index[0].tolist()
        slots, weights = self.send([pool.slot_of[e] for e in used], weights[0].numpy(), dtype)
        return used, slots, weights

    def probabilities(self, router_logits: torch.Tensor) -> torch.Tensor:
        return self.adapter.probabilities(router_logits)

    def restrict(self, logits: torch.Tensor, resident):
        """Weights [1, k'] (float32, on the host) and ids [1, k'] among the `resident`
        experts, k' = min(k, how many are resident)."""
        allowed = allowed_mask(self.num_experts, resident, logits.device)
        weights, index = self.adapter.restrict(self.own, logits, allowed)
        held = min(self.top_k, len(resident))
        return weights[:, :held].float().cpu(), index[:, :held].cpu()

    def requested(self) -> list[list[int]]:
        """Each token's requested experts so far, in the router's order."""
        return [step[1] for step in self.trace]

    def refreshes(self) -> int:
        """How many of the tokens so far refreshed the policy's cached set."""
        return sum(bool(step[4]) for step in self.trace)

    def host(self, probs) -> np.ndarray:
        """One token's probabilities on the host, from a trace entry (probs, or logits [1, N])."""
        if isinstance(probs, torch.Tensor):
            return self.probabilities(probs)[0].numpy()
        return probs

    def steps(self) -> list[dict]:
        """The trace so far, one dict per token (kept as tuples while decoding), with the
        router's probabilities (from the logits where the policy read none)."""
        return [
            dict(
                zip(
                    STEP_FIELDS,
                    (*step[:5], 0.0 if step[5] is None else step[5].seconds(), self.host(step[6])),
                    strict=True,
                )
            )
            for step in self.trace
        ]


class Sender:
    """Slot ids (and weights) of one token to the device without a host sync: through a
    pinned staging buffer on a GPU, whose previous copy the block's one sync has waited for.
    `host_ids`: the kernel reads the slot ids on the host, so they stay there."""

    def __init__(self, top_k: int, device: torch.device, host_ids: bool = False):
        self.device, self.cuda, self.host_ids = device, gpu.cuda_path(device), host_ids
        if self.cuda:
            self.slots_host = gpu.empty_pinned((1, top_k), torch.int64)
            self.weights_host = gpu.empty_pinned((1, top_k), torch.float32)

    def __call__(self, slots: list[int], weights: np.ndarray | None = None, dtype=None):
        # Slot ids the kernel reads on the host stay a list, [[slot, ...]] for one token.
        if not self.cuda:
            sent = [slots] if self.host_ids else torch.tensor([slots])
            return sent if weights is None else (sent, torch.from_numpy(weights)[None].to(dtype))
        if self.host_ids:
            sent = [slots]
        else:
            self.slots_host[0].copy_(torch.tensor(slots))
            sent = self.slots_host.to(self.device, non_blocking=True)
        if weights is None:
            return sent
        self.weights_host[0].copy_(torch.from_numpy(weights))
        return sent, self.weights_host.to(self.device, non_blocking=True).to(dtype)
