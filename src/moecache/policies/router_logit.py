"""Lowest current router logit: evict the resident the router rates lowest for this token
(softmax keeps the logits' order, so the lowest probability is the lowest logit)."""

from moecache.policies.base import EvictionPolicy


class RouterLogit(EvictionPolicy):
    name = "router-logit"

    def victim(self, t, candidates, probs):
        return min(candidates, key=lambda e: (probs[e], self.last_use[e], e))
