"""Admission under a ranked eviction rule: which of a token's device misses are copied in
(docs/tiers.md). The device tier of policies/tiers.py decides with it, for the tiered replay
and the tiered harness alike.

- `always`: every miss is copied in, the rule choosing victims (the rule's own `step`);
- `bypass`: misses predicted back soonest first take the free slots; each further one
  displaces the rule's next victim only if predicted back sooner than it; the first refusal
  sends it and the rest to the host, which computes them. The prediction is the true next
  use for a rule that reads the future (`TrueNextUse`), else recency (`Recency`).
"""

from __future__ import annotations

import numpy as np

from moecache.policies.eviction import EvictionPolicy
from moecache.policies.farthest_future import next_requests
from moecache.policies.pools import NONE, OUTSIDE, Pools, StepChange

ADMISSIONS = ("always", "bypass")


def device_step(
    policy: EvictionPolicy, t: int, at, probs, pools: Pools, bypass: bool, predict
) -> tuple[StepChange, np.ndarray]:
    """Token t on one stream's device (`at` [1, k] its request): the plan, always or bypass,
    and the requested experts that were missing (copied or computed: the host must hold
    them); the prediction learns the request after."""
    missing = at[0][pools.base[0, at[0]] >= OUTSIDE]
    if bypass:
        plan = admitted(policy, t, at, probs, pools, missing, predict)
    else:
        plan = policy.step(t, at, probs, pools)
    predict.learn(t, at[0])
    return plan, missing


def admitted(
    policy: EvictionPolicy, t: int, at, probs, pools: Pools, missing, predict
) -> StepChange:
    """Token t's bypass step for one stream: `at` [1, k] its request, `missing` the
    requested experts not on the device (in request order). The rule learns from every
    requested expert; the plan's `at` holds the admitted experts, soonest predicted first."""
    missing = missing[np.argsort(predict.requested(t, missing), kind="stable")]
    free = policy.capacity - int(pools.count[0])
    rest = missing[free:]
    victims = NONE
    if len(rest):
        order = policy.eviction_order(t, slice(0, 1), at, probs, pools, len(rest))[0]
        sooner = predict.requested(t, rest) < predict.resident(t, order)
        taken = len(sooner) if sooner.all() else int(np.argmin(sooner))  # first refusal ends
        victims = order[:taken]
    policy.learn(t, slice(0, 1), at, probs)
    admit = missing[: free + len(victims)]
    every = np.ones((1, len(admit)), dtype=bool)
    return StepChange(admit[None], every, np.array([len(admit)]), victims)


class TrueNextUse:
    """The oracle's prediction: each expert's true next use (lower is sooner), seen only
    within the rule's foresight when it has one (beyond it: never)."""

    def __init__(self, requests, num_experts: int, foresight: int | None = None):
        self.after, ahead, self.never = next_requests(requests[None], num_experts)
        self.ahead, self.requests, self.foresight = ahead[0], requests, foresight

    def seen(self, t: int, ahead: np.ndarray) -> np.ndarray:
        if self.foresight is None:
            return ahead
        return np.where(ahead - t > self.foresight, self.never, ahead)

    def requested(self, t: int, experts) -> np.ndarray:
        """Next use after t of experts token t requests."""
        at = (self.requests[t][None, :] == np.asarray(experts)[:, None]).argmax(axis=1)
        return self.seen(t, self.after[t, 0][at])

    def resident(self, t: int, experts) -> np.ndarray:
        return self.seen(t, self.ahead[experts])

    def learn(self, t: int, request) -> None:
        self.ahead[request] = self.after[t, 0]


class Recency:
    """A causal prediction: the more recently used comes back sooner (lower is sooner; a
    never-used expert displaces no one)."""

    def __init__(self, num_experts: int):
        self.last = np.full(num_experts, -1, dtype=np.int64)  # -1: never used

    def requested(self, t: int, experts) -> np.ndarray:
        return -self.last[experts]

    def resident(self, t: int, experts) -> np.ndarray:
        return -self.last[experts]

    def learn(self, t: int, request) -> None:
        self.last[request] = t
