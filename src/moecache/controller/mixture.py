"""The restricted MoE block the heads train through: the model's own router and experts,
frozen, with routing restricted to a cache that the heads drive token by token.

`soft` (the differentiable objective): the cache is a membership vector in [0, 1]^N,
m_t = (1 - beta_t) m_{t-1} + beta_t s_t, where s_t is a soft top-C of the selection scores;
gradients reach both heads through the restricted routing weights p * m. `sampled` (the
policy-gradient objective): refreshes are drawn from Bernoulli(beta_t) and new sets by
Gumbel top-C from the scores (Plackett-Luce), so the cache is a 0/1 mask exactly as in the
harness, and the block keeps the log-probability of its decisions. Either way a sequence's
first token selects a set (the harness's untimed fill), and the router then chooses its
top k with each expert's probability scaled by its membership, through the family's
adapter (`MoeAdapter.mix`): its full softmax, renormalised where the family's router
renormalises (not OLMoE's), DeepSeek-V2's group limit and `routed_scaling_factor`; with a
0/1 cache that is the harness's restricted routing, and with every expert cached the
model's own block. The family's shared experts are added. Families whose router does not
select on softmax probabilities refuse this stage (MoeAdapter.unsupported), here as in the
config's check.
"""

from __future__ import annotations

import torch
from torch import nn

from moecache.errors import MoecacheError

TINY = 1e-9


class ControlledBlock(nn.Module):
    def __init__(
        self, mlp, adapter, heads, layer: int, capacity: int, mode: str, temperature: float
    ):
        super().__init__()
        reason = adapter.unsupported("controller")
        if reason:
            raise MoecacheError(f"controller: the {adapter.family} family cannot run it: {reason}")
        object.__setattr__(self, "own", mlp)  # reached through the adapter, not registered
        self.adapter = adapter
        self.gate, self.experts = adapter.router(mlp), adapter.experts(mlp)
        self.heads, self.layer, self.capacity = heads, layer, capacity
        self.mode, self.temperature = mode, temperature
        self.stats: dict[str, torch.Tensor] = {}

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = hidden_states.shape
        x = hidden_states.reshape(-1, hidden)
        logits, top_weights, request = self.adapter.route(self.own, x)
        probs = self.adapter.probabilities(logits).view(batch, length, -1)
        beta, scores = self.heads(self.layer, hidden_states.float())
        if self.mode == "soft":
            member, stats = soft_cache(beta, scores, self.capacity, self.temperature)
        else:
            member, stats = sampled_cache(beta, scores, self.capacity)
        weights, index = self.adapter.mix(self.own, logits, member.reshape(-1, member.shape[-1]))
        out = self.experts(x, index, weights.to(x.dtype))
        shared = self.adapter.shared(self.own, x)
        out = out if shared is None else out + shared
        requested = request.view(batch, length, -1)
        # Of the experts the router asked for, how many the cache did not hold.
        stats["misses"] = (1 - member.gather(-1, requested)).sum(-1)
        restricted = probs * member
        q = restricted / restricted.sum(-1, keepdim=True).clamp_min(TINY)
        stats["kl"] = (probs * (probs.clamp_min(TINY).log() - q.clamp_min(TINY).log())).sum(-1)
        self.stats = stats
        return self.adapter.output(out.view(batch, length, hidden), top_weights)


def soft_top(scores: torch.Tensor, capacity: int, temperature: float) -> torch.Tensor:
    """Soft membership of the C best: a sigmoid around the midpoint between the C-th and
    (C + 1)-th scores (held fixed), so the hard top-C is its limit as temperature -> 0."""
    top = scores.topk(capacity + 1, dim=-1).values.detach()
    middle = (top[..., capacity - 1] + top[..., capacity]) / 2
    return torch.sigmoid((scores - middle[..., None]) / temperature)


def soft_cache(beta, scores, capacity: int, temperature: float):
    """m_t = (1 - beta_t) m_{t-1} + beta_t s_t, m_0 = s_0; per token the expected refresh,
    experts brought in, and indecision."""
    target = soft_top(scores, capacity, temperature)
    member, changed = [target[:, 0]], [torch.zeros_like(beta[:, 0])]
    for t in range(1, scores.shape[1]):
        b = beta[:, t, None]
        new = (1 - b) * member[-1] + b * target[:, t]
        changed.append((b * torch.relu(target[:, t] - member[-1])).sum(-1))
        member.append(new)
    refresh = torch.cat([torch.zeros_like(beta[:, :1]), beta[:, 1:]], dim=1)
    stats = {
        "refresh": refresh,
        "changed": torch.stack(changed, 1),
        "undecided": beta * (1 - beta),
    }
    return torch.stack(member, 1), stats


def plackett_luce(scores: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """Log-probability of drawing `chosen` [B, C] in order without replacement from
    softmax(scores) [B, N]."""
    picked = scores.gather(-1, chosen)
    total = torch.logsumexp(scores, -1, keepdim=True)
    before = torch.logcumsumexp(picked, -1)
    removed = torch.cat([torch.full_like(before[:, :1], -torch.inf), before[:, :-1]], -1)
    left = total + torch.log1p(-torch.exp(removed - total).clamp(max=1 - 1e-6))
    return (picked - left).sum(-1)


def sampled_cache(beta, scores, capacity: int):
    """Hard decisions drawn from the heads; their summed log-probability and entropy."""
    batch, length, n = scores.shape
    member, changed, refresh = [], [], []
    logp = beta.new_zeros(batch)
    held = None
    for t in range(length):
        s = scores[:, t]
        gumbel = -torch.log(-torch.log(torch.rand_like(s).clamp(TINY, 1 - TINY)))
        chosen = (s.detach() + gumbel).topk(capacity, -1).indices
        new = torch.zeros_like(s).scatter(-1, chosen, 1.0)
        if held is None:  # the first token selects (the untimed fill)
            go = torch.ones_like(beta[:, 0])
            logp = logp + plackett_luce(s, chosen)
            changed.append(torch.zeros_like(go))
        else:
            b = beta[:, t].clamp(TINY, 1 - TINY)
            go = torch.bernoulli(b.detach())
            logp = logp + go * (b.log() + plackett_luce(s, chosen)) + (1 - go) * (1 - b).log()
            changed.append(go * torch.relu(new - held).sum(-1))
            new = go[:, None] * new + (1 - go[:, None]) * held
        refresh.append(go if held is not None else torch.zeros_like(go))
        held = new
        member.append(new)
    b = beta.clamp(TINY, 1 - TINY)
    p = torch.softmax(scores, -1)
    entropy = -(b * b.log() + (1 - b) * (1 - b).log()) - (p * p.clamp_min(TINY).log()).sum(-1)
    stats = {
        "refresh": torch.stack(refresh, 1),
        "changed": torch.stack(changed, 1),
        "logp": logp,
        "entropy": entropy,
    }
    return torch.stack(member, 1), stats
