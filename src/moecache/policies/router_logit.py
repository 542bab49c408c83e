"""Lowest current router logit: evict the resident the router rates lowest for this token
(softmax keeps the logits' order, so the lowest probability is the lowest logit)."""

from moecache.policies.eviction import EvictionPolicy


class RouterLogit(EvictionPolicy):
    name = "router-logit"
    needs_probs = True

    def priority(self, t, rows, probs):
        return probs, self.recency[rows]
