"""Trace replay: run lossless eviction rules over recorded demand, no model involved.

Per-token semantics, as in the harness: before token t is computed every expert it
requests is resident, and a victim is never one that token needs. All streams advance
together, one token at a time, through the same policy objects the harness uses, so a
rule's counts here equal its closed-loop counts. Copies are counted three ways:
`insertions` (all), the harness's `fills` / `steady` split (records/counting.py: a pool
counts as filling until it has been full once, the whole group of copies that first fills
it included; a group here is one token of a stream), and
`after_fill`, the paper's steady traffic B: insertions beyond the first min(C, distinct)
that every lossless schedule makes (records/counting.after_fill, which the LP and the DP
subtract too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from moecache.errors import MoecacheError
from moecache.records import counting
from moecache.records.demand import Demand

if TYPE_CHECKING:  # the rules import numba: only a replay that runs one loads them
    from moecache.policies import EvictionPolicy

FIELDS = ("insertions", "fills", "steady", "after_fill")


@dataclass
class Counts:
    """Per stream, in the demand's stream order."""

    insertions: np.ndarray
    fills: np.ndarray
    steady: np.ndarray
    after_fill: np.ndarray
    residents: np.ndarray | None = None  # [streams, T, N] after each token, when kept
    evictions: np.ndarray | None = None  # [streams, T, N] victims of each token, when kept


def lossless_rules(demand: Demand | None = None) -> list[str]:
    """Every eviction rule in the registry but those that need a trained file (learned
    scorers run only when named); given a demand, those it can run (rules reading router
    probabilities need them recorded)."""
    from moecache import policies

    return [
        name
        for name, cls in policies.POLICIES.items()
        if issubclass(cls, policies.EvictionPolicy)
        and cls.by_default
        and (demand is None or demand.probs is not None or not cls.needs_probs)
    ]


def parse_rule(text: str) -> tuple[str, dict]:
    """'farthest-future:foresight=16,x=y' -> ('farthest-future', {'foresight': 16, ...})."""
    name, _, rest = text.partition(":")
    params = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise MoecacheError(f"rule {text!r}: parameters are written key=value")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return name, params


def make_rule(text: str, demand: Demand, capacity: int, top_k: int | None = None) -> EvictionPolicy:
    """The rule for requests of `top_k` experts (default: the demand's)."""
    demand.check_capacity(capacity)
    from moecache import policies

    name, params = parse_rule(text)
    policy = policies.make(name, capacity, demand.num_experts, top_k or demand.top_k, params)
    if not isinstance(policy, policies.EvictionPolicy):
        raise MoecacheError(f"rule {name}: not a lossless eviction rule (replay runs those)")
    if policy.needs_probs and demand.probs is None:
        raise MoecacheError(f"rule {name}: needs router probabilities, which this demand lacks")
    return policy


def run(demand: Demand, policy: EvictionPolicy, keep: bool = False) -> Counts:
    """Replay every stream of `demand` under `policy` (whose capacity is the pool's)."""
    from moecache.policies.pools import Pools

    capacity = policy.capacity
    demand.check_capacity(capacity)
    done = None if keep else compiled(demand, policy)
    if done is not None:
        return tally(*done, capacity, demand)
    # Longest streams first: the streams still running at token t are then the first rows.
    order = np.argsort(-demand.lengths, kind="stable")
    requests, lengths = demand.requests[order], demand.lengths[order]
    # Token-major copies, so each token's rows are one contiguous block.
    probs = demand.probs[order].transpose(1, 0, 2).copy() if policy.needs_probs else None
    streams, steps = requests.shape[:2]
    policy.reset(requests if policy.needs_future else None, streams=streams)
    alive = np.count_nonzero(lengths[:, None] > np.arange(steps), axis=0)
    at = (requests + (np.arange(streams) * demand.num_experts)[:, None, None]).transpose(1, 0, 2)
    at = at.copy()
    pools = Pools(streams, demand.num_experts, capacity)
    copies = np.zeros((steps, streams), dtype=np.int64)
    # Whether the pool had been full before the token: its copies are steady then.
    full = np.zeros((steps, streams), dtype=bool)
    been_full = np.zeros(streams, dtype=bool)
    if keep:
        residents = np.zeros((steps, streams, demand.num_experts), dtype=bool)
        evictions = np.zeros_like(residents)
    for t in range(steps):
        n = alive[t]
        step = policy.step(t, at[t, :n], None if probs is None else probs[t, :n], pools)
        copies[t, :n] = step.copies
        full[t, :n] = been_full[:n]
        pools.apply(n, step)
        been_full[:n] = counting.has_been_full(been_full[:n], pools.count[:n], capacity)
        if keep:
            residents[t, :n] = pools.resident[:n]
            np.put(evictions[t], step.victims, True)
    back = np.argsort(order)
    counts = tally(copies.T[back], full.T[back], capacity, demand)
    if keep:
        counts.residents = residents.transpose(1, 0, 2)[back]
        counts.evictions = evictions.transpose(1, 0, 2)[back]
    return counts


def compiled(demand: Demand, policy: EvictionPolicy):
    """Copies [S, T] and full-before [S, T] of every stream of `demand` in one compiled
    call through the kernel table (policies/kernels.py), or None where the rule has no
    compiled state (EvictionPolicy.compiled_state) and `run` steps it."""
    from moecache.policies import kernels

    state = policy.compiled_state(demand.requests, demand.lengths)
    if state is None:
        return None
    args = demand.requests, demand.lengths, policy.capacity, demand.num_experts
    return kernels.replay(policy.name, state, *args)


def tally(copies: np.ndarray, full: np.ndarray, capacity: int, demand: Demand) -> Counts:
    """Counts from the copies of each token [streams, T] and whether its pool had been
    full before it (records/counting.py)."""
    insertions = copies.sum(axis=1)
    fills, steady = counting.split(copies, full)
    return Counts(
        insertions,
        fills.sum(axis=1),
        steady.sum(axis=1),
        counting.after_fill(insertions, demand.distinct, capacity),
    )


def gap_recovered(lru: int, oracle: int, rule: int) -> float | None:
    """Share of the LRU-to-oracle gap a rule recovers (1 = as few copies as the oracle)."""
    return None if lru == oracle else (lru - rule) / (lru - oracle)


def report(demand: Demand, capacity: int, rules: list[str] | None = None) -> dict:
    """Counts per stream and in total for each rule, with the share of the gap between LRU
    and farthest-future (full lookahead) that each rule recovers."""
    return report_parts([demand], capacity, rules)


def replayed(demand: Demand, text: str, capacity: int) -> Counts:
    """The counts of rule `text` over `demand`."""
    return run(demand, make_rule(text, demand, capacity))


def rule_report(c: Counts, names, lengths, timed: int, lru, oracle) -> dict:
    """One rule's totals (copies per timed token, the share of LRU's gap to the oracle it
    closes) and its counts per stream."""
    totals = {
        "insertions": int(c.insertions.sum()),
        "fills": int(c.fills.sum()),
        "steady": int(c.steady.sum()),
        "after_fill": int(c.after_fill.sum()),
        "copies_per_token": float(c.steady.sum() / timed) if timed else None,
        "gap_recovered": gap_recovered(lru, oracle, c.after_fill.sum()),
    }
    rows = zip(names, lengths, c.insertions, c.fills, c.steady, c.after_fill, strict=True)
    streams = [
        {
            "stream": name,
            "tokens": int(n),
            "insertions": int(i),
            "fills": int(f),
            "steady": int(s),
            "after_fill": int(a),
        }
        for name, n, i, f, s, a in rows
    ]
    return {"totals": totals, "streams": streams}


def report_parts(
    parts, capacity: int, rules: list[str] | None = None, progress=None, replay=replayed, timed=None
) -> dict:
    """report() over demand that comes in parts (batches of whole streams, one held at a
    time: moecache.replay.stream), every rule replaying each part before the next is read.
    `progress(part)` hears of each part done. `replay(part, rule, capacity)` gives a rule's
    counts, and `timed` the tokens copies count against (default: each sequence's tokens
    after its first); batched demand (moecache.replay.batch) sets both."""
    kept, names, sequences, lengths = {}, [], [], []
    for demand in parts:
        rules = rules or lossless_rules(demand)
        wanted = rules + [r for r in ("lru", "farthest-future") if r not in rules]
        for text in wanted:
            kept.setdefault(text, []).append(replay(demand, text, capacity))
        names += demand.streams
        sequences += demand.sequences
        lengths.append(demand.lengths)
        shape = demand.num_experts, demand.top_k
        if progress:
            progress(demand)
    if not names:
        raise MoecacheError("no streams to replay")
    counts = {
        text: Counts(*(np.concatenate([getattr(c, f) for c in runs]) for f in FIELDS))
        for text, runs in kept.items()
    }
    lengths = np.concatenate(lengths)
    lru, oracle = counts["lru"].after_fill.sum(), counts["farthest-future"].after_fill.sum()
    if timed is None:
        first = dict(zip(sequences, lengths.tolist(), strict=True))
        timed = sum(n - 1 for n in first.values())
    out = {text: rule_report(counts[text], names, lengths, timed, lru, oracle) for text in rules}
    return {
        "capacity": capacity,
        "experts": shape[0],
        "top_k": shape[1],
        "streams": len(names),
        "tokens": int(lengths.sum()),
        "timed_tokens": timed,
        "rules": out,
    }
