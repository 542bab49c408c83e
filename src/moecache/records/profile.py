"""What the harness measures of the model before the decode runs: its profile (`moecache
profile`: results/profile/model.json, `ProfileResult`: one copy, one token's compute,
held-out NLL and routing reuse) and the layer probe (`moecache probe`: results/probe/
<shard>.json, `ProbeResult`: Delta NLL with one layer restricted at a time)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from moecache.records.stamped import SCHEMA, Stamped


@dataclass(frozen=True, kw_only=True)
class ProfileResult(Stamped):
    what: ClassVar[str] = "a model profile"
    leading: ClassVar[tuple[str, ...]] = ("device",)  # the profile names its device first

    schema: int = SCHEMA
    expert_bytes: int
    expert_copy_ms: float
    token_compute_ms: float
    timed_tokens: int
    heldout_nll: float
    reuse_per_layer: list
    reuse_shuffled_per_layer: list
    copy_share_of_token: float


@dataclass(frozen=True, kw_only=True)
class ProbeResult(Stamped):
    what: ClassVar[str] = "a layer probe"

    schema: int = SCHEMA
    probe: dict  # the policy restricting each layer in turn
    base_nll: float
    layers: list  # one row per sparse layer: layer, nll, delta_nll, rho
