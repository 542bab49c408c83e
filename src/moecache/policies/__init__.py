"""Cache policies: one small module each, all behind moecache.policies.policy.Policy.

A rule is one module in this folder and nothing else: at import the package imports every
module on its path (`discover`) and registers each Policy subclass a module defines with a
`name` of its own (docs/writing-a-rule.md). A zoo rule names its libCacheSim counterpart
in `libcachesim`, which puts it in ZOO.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from moecache.errors import MoecacheError
from moecache.policies.event_driven import EventPolicy
from moecache.policies.eviction import EvictionPolicy
from moecache.policies.policy import Policy, PoolChange
from moecache.policies.scheduled import ScheduledPolicy

# Where reports and `moecache replay` list the rules they have always listed (the order of
# the hand-written registry this replaced); any other rule follows them, by module name.
# Only the order: a rule missing here is found and runs all the same.
ORDER = (
    "all",
    "lru",
    "decayed-frequency",
    "mean-interval",
    "mean-interval-literal",
    "router-logit",
    "co-activation",
    "reuse-distance",
    "next-use",
    "farthest-future",
    "learned",
    "dwell",
    "static",
    "oracle-set",
    "controller",
    # The zoo: classic per-request rules run per token (one file each, EventPolicy).
    "fifo",
    "clock",
    "lfu",
    "slru",
    "two-q",
    "arc",
    "lirs",
    "sieve",
    "s3-fifo",
    "w-tinylfu",
)
# Modules that hold no rule and import torch at module level (the learned scorer's and the
# controller's networks): the registry and replay must load without torch, so the rules
# that need them import them inside their functions and discovery passes them by.
HELPERS = frozenset({"scorers", "controller_heads"})

POLICIES: dict[str, type[Policy]] = {}
# Each zoo rule -> the libCacheSim class of the same algorithm (tests/test_zoo.py).
ZOO: dict[str, str] = {}

__all__ = [
    "ORDER",
    "POLICIES",
    "ZOO",
    "EventPolicy",
    "EvictionPolicy",
    "PoolChange",
    "Policy",
    "ScheduledPolicy",
    "discover",
    "make",
]


def rules_in(module) -> list[type[Policy]]:
    """The rules `module` defines: Policy subclasses of its own that set their own `name`
    (imported classes and unnamed helper bases are not its rules)."""
    return [
        cls
        for cls in vars(module).values()
        if inspect.isclass(cls)
        and issubclass(cls, Policy)
        and cls.__module__ == module.__name__
        and vars(cls).get("name")
    ]


def discover() -> None:
    """Import every module on the package's path and register the rules they define, in
    place (callers hold POLICIES and ZOO). Two rules under one name are refused in one
    line. A rule kept outside the folder is found once its folder is on `__path__`."""
    found: dict[str, type[Policy]] = {}
    for info in pkgutil.iter_modules(__path__, __name__ + "."):
        if info.name.rpartition(".")[2] in HELPERS:
            continue
        for cls in rules_in(importlib.import_module(info.name)):
            other = found.setdefault(cls.name, cls)
            if other is not cls:
                raise MoecacheError(
                    f"policy {cls.name!r} is defined twice: in {other.__module__} and "
                    f"{cls.__module__}"
                )
    rank = {name: i for i, name in enumerate(ORDER)}
    rules = sorted(found.values(), key=lambda c: (rank.get(c.name, len(ORDER)), c.__module__))
    POLICIES.clear()
    POLICIES.update((cls.name, cls) for cls in rules)
    ZOO.clear()
    ZOO.update((cls.name, cls.libcachesim) for cls in rules if cls.libcachesim)


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


discover()
