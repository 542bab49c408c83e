"""The groups of learned scorers, by name; no torch, so the config check and the workflow
read them too.

`router` (router and past-use features) and `trace-past-use` (past use alone, the
ablation) fit on the training trace and are evaluated on every held-out shard;
`past-use-<shard>` fits past-use features on that shard's first sequences and is evaluated
on it. A scorer is named group/kind.
"""

from __future__ import annotations

from moecache.errors import MoecacheError

TRACE_GROUPS = {"router": "router", "trace-past-use": "past-use"}  # group -> feature set
CONTROL = "mlp-permuted"  # the MLP trained on permuted labels
TRAINING_TRACE = "training-trace"  # the routing a trace group fits on


def feature_set(group: str) -> str:
    if group in TRACE_GROUPS:
        return TRACE_GROUPS[group]
    if group.startswith("past-use-"):
        return "past-use"
    raise MoecacheError(
        f"scorer group {group!r}: known groups are router, trace-past-use, past-use-<shard>"
    )


def names(learned: dict, shards) -> list[str]:
    """Every group the config trains: the ablation only when it names kinds."""
    ablation = ["trace-past-use"] if learned["trace_past_use"] else []
    return ["router", *ablation, *(f"past-use-{shard}" for shard in shards)]


def source(group: str) -> str:
    """The routing a group fits on: the training trace, or its shard's trace."""
    return TRAINING_TRACE if group in TRACE_GROUPS else group.removeprefix("past-use-")


def trained_kinds(learned: dict, group: str) -> list[str]:
    """The kinds of scorer a group trains: `learned.kinds` (router), `past_use_kinds`
    (past-use-<shard>), `trace_past_use` (the ablation)."""
    key = {"router": "kinds", "trace-past-use": "trace_past_use"}.get(group, "past_use_kinds")
    return list(learned[key])


def group_kinds(learned: dict, group: str) -> list[str]:
    """The scorers a group trains and, with an MLP among them outside the ablation, the
    control (the MLP on permuted labels)."""
    kinds = trained_kinds(learned, group)
    control = "mlp" in kinds and group != "trace-past-use"
    return [*kinds, *([CONTROL] if control else [])]


def applies(name: str, shard: str) -> bool:
    """Past-use scorers of a shard are evaluated on it; trace scorers on every shard."""
    group = name.split("/")[0]
    return group in TRACE_GROUPS or group == f"past-use-{shard}"
