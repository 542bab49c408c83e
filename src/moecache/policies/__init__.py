"""Cache policies: one small module each, all behind moecache.policies.policy.Policy.

Add a policy by writing a module with a Policy subclass and naming it in POLICIES
(docs/writing-a-rule.md shows it for an event-driven eviction rule).
"""

from __future__ import annotations

import inspect

from moecache.errors import MoecacheError
from moecache.policies.all_resident import AllResident
from moecache.policies.arc import ARC
from moecache.policies.clock import Clock
from moecache.policies.co_activation import CoActivation
from moecache.policies.controller import Controller
from moecache.policies.decayed_frequency import DecayedFrequency
from moecache.policies.dwell import Dwell, Static
from moecache.policies.event_driven import EventPolicy
from moecache.policies.eviction import EvictionPolicy
from moecache.policies.farthest_future import FarthestFuture
from moecache.policies.fifo import FIFO
from moecache.policies.learned import Learned
from moecache.policies.lfu import LFU
from moecache.policies.lirs import LIRS
from moecache.policies.lru import LRU
from moecache.policies.mean_interval import MeanInterval
from moecache.policies.mean_interval_literal import MeanIntervalLiteral
from moecache.policies.next_use import NextUse
from moecache.policies.oracle_set import OracleSet
from moecache.policies.policy import Plan, Policy
from moecache.policies.reuse_distance import ReuseDistance
from moecache.policies.router_logit import RouterLogit
from moecache.policies.s3_fifo import S3FIFO
from moecache.policies.scheduled import ScheduledPolicy
from moecache.policies.sieve import Sieve
from moecache.policies.slru import SLRU
from moecache.policies.two_q import TwoQ
from moecache.policies.w_tinylfu import WTinyLFU

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        AllResident,
        LRU,
        DecayedFrequency,
        MeanInterval,
        MeanIntervalLiteral,
        RouterLogit,
        CoActivation,
        ReuseDistance,
        NextUse,
        FarthestFuture,
        Learned,
        Dwell,
        Static,
        OracleSet,
        Controller,
        # The zoo: classic per-request rules run per token (one file each, EventPolicy).
        FIFO,
        Clock,
        LFU,
        SLRU,
        TwoQ,
        ARC,
        LIRS,
        Sieve,
        S3FIFO,
        WTinyLFU,
    )
}

# Each zoo rule -> the libCacheSim class of the same algorithm (tests/test_zoo.py).
ZOO = {
    "fifo": "FIFO",
    "clock": "Clock",
    "lfu": "LFU",
    "slru": "SLRU",
    "two-q": "TwoQ",
    "arc": "ARC",
    "lirs": "LIRS",
    "sieve": "Sieve",
    "s3-fifo": "S3FIFO",
    "w-tinylfu": "WTinyLFU",
}

__all__ = [
    "POLICIES",
    "ZOO",
    "EventPolicy",
    "EvictionPolicy",
    "Plan",
    "Policy",
    "ScheduledPolicy",
    "make",
]


def make(name: str, capacity: int, num_experts: int, top_k: int, params: dict) -> Policy:
    """Build policy `name` with keyword `params`; unknown names or parameters are one line."""
    if name not in POLICIES:
        raise MoecacheError(f"unknown policy {name!r} (known: {', '.join(sorted(POLICIES))})")
    cls = POLICIES[name]
    allowed = set(inspect.signature(cls.__init__).parameters) - {
        "self",
        "capacity",
        "num_experts",
        "top_k",
    }
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise MoecacheError(
            f"policy {name}: unknown parameter {unknown[0]!r} (allowed: "
            f"{', '.join(sorted(allowed)) or 'none'})"
        )
    return cls(capacity, num_experts, top_k, **params)
