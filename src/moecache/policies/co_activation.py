"""Co-activation: evict the resident least likely to follow the experts just requested.

Each stream learns, as it decodes, how often expert e was requested by the token after one
that requested f (counts decayed by `decay` per token, so an old document's habits fade).
At token t an expert's score is the chance of following the recent tokens' experts: the sum
over f of context[f] * follows[f, e] / (times f was followed + 1), where context is token
t's request plus the earlier ones decayed by `context_decay` (0: token t alone). The lowest
score is evicted; ties (experts never seen to follow) go to the least recently used, then
the lowest id. Causal: it reads only requests up to token t, and learns t's after its
victims are chosen. Nothing is trained beforehand; the two decays are tuned on the learned
stage's training trace (the defaults: its best point).
"""

import numpy as np

from moecache.errors import MoecacheError
from moecache.policies.eviction import EvictionPolicy


class CoActivation(EvictionPolicy):
    name = "co-activation"

    def __init__(
        self, capacity, num_experts, top_k, decay: float = 0.99, context_decay: float = 0.5
    ):
        super().__init__(capacity, num_experts, top_k)
        if not 0 < decay <= 1:
            raise MoecacheError(f"policy {self.name}: decay {decay} must lie in (0, 1]")
        if not 0 <= context_decay < 1:
            raise MoecacheError(
                f"policy {self.name}: context_decay {context_decay} must lie in [0, 1)"
            )
        self.decay, self.context_decay = decay, context_decay

    def reset(self, future=None, streams=1):
        super().reset(future, streams)
        n = self.num_experts
        self.follows = np.zeros((streams, n, n))  # [stream, f, e]: e at t after f at t-1
        self.followed = np.zeros((streams, n))  # decayed times f had a next token
        self.previous = np.zeros((streams, n))  # indicator of token t-1's request
        self.context = np.zeros((streams, n))  # decayed indicator of tokens up to t

    def step(self, t, at, probs, pools):
        self.take_context(at)
        return super().step(t, at, probs, pools)

    def take_context(self, at):
        """Token t's request joins the context before its victims are chosen (a rule that
        reads this one's scores, policies/next_use.py, calls it too)."""
        rows = slice(0, len(at))
        self.context[rows] *= self.context_decay
        self.context.put(at, 1.0 + self.context.take(at))

    def priority(self, t, rows, probs):
        rate = self.follows[rows] / (self.followed[rows] + 1.0)[:, :, None]
        score = np.einsum("sf,sfe->se", self.context[rows], rate)
        return score, self.recency[rows]

    def learn(self, t, rows, at, probs):
        super().learn(t, rows, at, probs)
        now = np.zeros_like(self.previous[rows])
        now.put(at, 1.0)  # at is flat over the first rows: row * N + expert
        self.follows[rows] *= self.decay
        self.followed[rows] *= self.decay
        self.follows[rows] += self.previous[rows][:, :, None] * now[:, None, :]
        self.followed[rows] += self.previous[rows]
        self.previous[rows] = now
