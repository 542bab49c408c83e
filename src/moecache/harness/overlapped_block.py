"""The overlapped MoE block: the pooled block with copies beside the compute and prefetching.

Per token: route, ask the eviction rule for the pool's change, submit the missing copies,
then compute the experts one by one, each waiting on its own copy just before its matmul,
so that later copies land while earlier experts compute; then ask the arm's prefetcher what
to copy ahead and submit it into the target block's pool, victims chosen by that pool's
eviction rule.
Routing is the pooled block's exactly, so lossless runs keep the blocking runs' NLL and
demand. Build an arm of them with `Offload.arm(..., block=overlapped(prefetch))`.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from moecache import prefetch as prefetchers
from moecache.errors import MoecacheError
from moecache.harness import copy_engine
from moecache.harness.async_pool import AsyncExpertPool
from moecache.harness.pool import ExpertPool
from moecache.harness.pooled_block import PooledMoeBlock
from moecache.harness.timing import Stopwatch
from moecache.model.kernel import expert
from moecache.policies import EvictionPolicy
from moecache.policies.pools import Pools


class OverlappedBlock(PooledMoeBlock):
    def __init__(self, mlp, pool: ExpertPool, policy, adapter, engine, prefetcher):
        """`pool`: the blocking pool Offload.arm built, whose slots and link this block's
        asynchronous pool takes over; `engine`: the arm's one copy engine."""
        pool = AsyncExpertPool(pool.host, pool.capacity, pool.multiplier, pool.link, engine)
        super().__init__(mlp, pool, policy, adapter)
        self.layer = pool.layer = policy.layer
        self.prefetcher = prefetcher
        self.span = Stopwatch(pool.host.device)
        self.following = self  # the next restricted layer's block (OverlappedArm links them)
        self.future = None

    def reset(self, future=None) -> None:
        if self.prefetcher.needs_trace and future is None:
            raise MoecacheError(
                f"prefetch {self.prefetcher.name}: reads the recorded demand; the arm must "
                "read an earlier run's trace (future_of)"
            )
        super().reset(future)
        self.future = future

    def token(self, x, probs, request, top_weights, dtype, logits, lap=None) -> torch.Tensor:
        pool, t = self.pool, self.t
        self.span.start()
        pool.begin(t, request, () if self.policy.restricts else request)
        change = self.policy.change(t, request, probs, pool.resident)
        if change.admit or change.evict:
            pool.settle(change.evict)
            pool.apply(change)
        used, slots, weights = self.chosen(request, top_weights, dtype, logits)
        pool.count_demand(change.admit, used, waits_first=not self.send.host_ids)
        kept = logits if probs is None else probs
        self.trace.append((t, request, used, len(change.admit), change.refresh, lap, kept))
        out = self.experts_output(x, used, slots, weights)
        pool.end(t)
        self.t += 1
        self.prefetch(t, x + out)
        pool.spans.append(self.span.lap())
        return out

    def experts_output(self, x, used, slots, weights) -> torch.Tensor:
        """The routed experts' output; with the per-expert kernel, expert by expert, each
        waiting for its copy (the kernel's own arithmetic: the same sums, in its order)."""
        pool = self.pool
        if not self.send.host_ids:  # a fused kernel reads all the token's experts at once
            for e in used:
                pool.wait(e)
            return pool.kernel(x, slots, weights)
        out = torch.zeros_like(x)
        for j, (e, slot) in enumerate(zip(used, slots[0], strict=True)):
            pool.wait(e)
            out += weights[0, j] * expert(pool.kernel, slot, x)
        return out

    def prefetch(self, t: int, hidden: torch.Tensor) -> None:
        want = self.prefetcher.want(self, t, hidden)
        if want is None or not want.experts:
            return
        target = want.block
        victims = functools.partial(rule_victims, target.policy, target.t, target.pool.resident)
        target.pool.prefetch(want.experts, want.deadline, victims)


def rule_victims(policy: EvictionPolicy, t: int, resident, protected: set, count: int) -> list:
    """Up to `count` residents outside `protected`, in the eviction rule's order before
    token t (its ranking only: the rule learns nothing from a prefetch)."""
    n = policy.num_experts
    pools = Pools.holding(resident, n, policy.capacity)
    at = np.asarray([sorted(protected)], dtype=np.int64).reshape(1, -1)
    order = policy.eviction_order(t, slice(0, 1), at, None, pools, min(count, n))[0]
    return [int(e) for e in order if e in resident and e not in protected][:count]


class OverlappedArm:
    """`block=` for Offload.arm: builds one arm's overlapped blocks, in layer order, over
    one copy engine (one link) and one prefetcher, each block linked to the next."""

    def __init__(self, prefetch: str = "none", params: dict | None = None):
        self.prefetcher = prefetchers.make(prefetch, params)
        self.engine, self.blocks = None, []

    def __call__(self, mlp, pool: ExpertPool, policy, adapter) -> OverlappedBlock:
        refuse_unranked(self.prefetcher.name, policy)
        if self.engine is None:
            self.engine = copy_engine.make(pool.host.device, pool.multiplier, pool.link)
        block = OverlappedBlock(mlp, pool, policy, adapter, self.engine, self.prefetcher)
        if self.blocks and block.layer <= self.blocks[-1].layer:
            raise MoecacheError("overlapped blocks: restricted layers must come in ascending order")
        self.blocks.append(block)
        self.blocks[-2 if len(self.blocks) > 1 else -1].following = block
        block.following = self.blocks[0]
        return block


def refuse_unranked(prefetch: str, policy) -> None:
    """A prefetcher's victims are the eviction rule's ranking (rule_victims): a rule that
    restricts, reads the router's probabilities, or ranks only inside its own compiled step
    (the zoo's kernels) has none to give."""
    if prefetch == "none":
        return
    ranks = isinstance(policy, EvictionPolicy) and not policy.needs_probs
    if not ranks or type(policy).priority is EvictionPolicy.priority:
        raise MoecacheError(
            f"prefetch {prefetch}: needs a lossless eviction rule that ranks its residents "
            f"without the router's probabilities, not {policy.name} (prefetch none overlaps "
            "its demand copies)"
        )


def overlapped(prefetch: str = "none", **params) -> OverlappedArm:
    """The `block=` of an overlapped arm prefetching with `prefetch` (PREFETCHERS)."""
    return OverlappedArm(prefetch, params)
