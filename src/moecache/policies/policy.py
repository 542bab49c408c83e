"""The one interface every cache policy implements, for one restricted layer.

Per token t the pooled block asks `policy.change(t, request, probs, resident)` which experts
to evict (no data moves) and which to copy in, applies that plan to its pool, and then
computes the token: with the router's own choice (`request`) when the policy is lossless,
or with the router's best `top_k` among the resident experts when `restricts` is true.
The same objects drive trace replay, so a rule's copy count is defined once.

`Policy` is the one interface: every rule is one, the harness and replay call nothing
else. The families below build on it and add no interface of their own, only helpers
for writing a rule: eviction.py (ranked lossless rules, `step` over many streams),
event_driven.py (rules that react to hits and misses; kernels.py compiles them) and
scheduled.py (restricting rules that refresh a set). There is one `reset`, this one: a
family or rule that keeps state extends it and calls `super().reset(future, streams)`
first, so that every rule checks its arguments here and starts from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import numpy as np

from moecache.errors import MoecacheError
from moecache.records.shape import check_shape


@dataclass
class PoolChange:
    """What the pool does before token t is computed: drop `evict`, then copy in `admit`."""

    admit: list[int] = field(default_factory=list)
    evict: list[int] = field(default_factory=list)
    refresh: bool = False  # a restricting policy replaced its set here (trace: refreshed)


class Policy:
    """Base of all policies. Subclasses set `name` and take their parameters as keywords."""

    name: str = ""
    restricts: bool = False  # True: the router may choose only among resident experts
    needs_future: bool = False  # True: reset() must be given the recorded demand
    needs_probs: bool = False  # True: decides from the router's probabilities
    needs_hidden: bool = False  # True: decide(x) reads the block's input hidden state
    layer: int | None = None  # the restricted layer it serves (set by the harness)
    by_default: bool = True  # False: replayed only when named (it needs a trained file)
    many_streams: bool = False  # True: reset() may start many streams (replay's `step`)
    libcachesim: str = ""  # the libCacheSim class of the same algorithm (a zoo rule)

    def __init__(self, capacity: int, num_experts: int, top_k: int):
        check_shape(top_k, capacity, num_experts, where=f"policy {self.name}")
        self.capacity, self.num_experts, self.top_k = capacity, num_experts, top_k

    def reset(self, future: Sequence[Sequence[int]] | None = None, streams: int = 1) -> None:
        """Start `streams` sequences, each with an empty pool. `future` is this layer's
        demand for the whole sequence, as recorded by an earlier run (only for rules with
        needs_future). Only lossless eviction rules serve many streams at once (replay);
        the others serve the harness's one. A rule that overrides it calls
        super().reset(future, streams) first, then starts its own state."""
        if self.needs_future and future is None:
            raise MoecacheError(f"policy {self.name}: needs the demand trace of an earlier run")
        if streams != 1 and not self.many_streams:
            raise MoecacheError(f"policy {self.name}: serves one stream, asked for {streams}")
        self.future = future

    def decide(self, x):
        """For needs_hidden: the policy's own computation on the block's input hidden states
        x [T, H], on the device, inside the timed step; one row per token, handed back on
        the host through see() before that token's plan."""
        raise NotImplementedError

    def see(self, row: np.ndarray) -> None:
        """The host copy of this token's row of decide()."""
        raise NotImplementedError

    def change(
        self, t: int, request: Sequence[int], probs: np.ndarray | None, resident: AbstractSet[int]
    ) -> PoolChange:
        """`request`: the router's top-k for token t, in the router's order (most probable
        first); `probs`: its softmax over all experts (None for a policy that reads none,
        `needs_probs` and `restricts` false)."""
        raise NotImplementedError

    def last_use(self, t: int, width: int) -> np.ndarray:
        """Recency keys for token t's `width` requested experts, in request order:
        (1 + t) * top_k + position. Higher is more recent, and 0 (never requested) sorts
        first. This is an ordered map of last use that moves each requested expert to its
        end in request order: a later token is more recent, and of the experts one token
        requests the one requested earlier counts as less recent."""
        if width > self.top_k:
            raise MoecacheError(
                f"policy {self.name}: token {t} requests {width} experts, more than "
                f"top-k {self.top_k}"
            )
        return (1 + t) * self.top_k + np.arange(width, dtype=np.int64)

    def cache_to(self, target, resident, order=None, refresh=True) -> PoolChange:
        """The plan that makes `target` resident: admit what is missing, and evict residents
        outside it, first by `order` (default: the lower id), only as far as the admitted
        need room (a restricting policy's refresh)."""
        admit = [e for e in target if e not in resident]
        room = self.capacity - len(resident)
        spare = sorted(set(resident).difference(target), key=order)
        return PoolChange(admit=admit, evict=spare[: max(0, len(admit) - room)], refresh=refresh)
