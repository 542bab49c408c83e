"""What a causal rule's decisions cost, measured, against what the copies it saves are worth.

Every rule (LRU first, the reference) is driven through `Policy.change`, the call the harness
makes once per layer and token, over a trace's streams (one layer of one sequence each):
each rule its own policy and resident set, the rules taking turns at every token in an
order shuffled per token (seeded), so that the machine's drift falls on all of them alike.
Each call is timed on the monotonic clock (time.perf_counter_ns); the whole pass is
repeated `rounds` times and each stream keeps its median round. A decision is one layer's
change for one token. Its cost over LRU's is set against the copies the rule saves per
decision (its replay on the same streams) times one expert's copy time at 1x (the measured
bandwidth record): a rule whose extra time per decision exceeds that saves nothing at 1x.
"""

from __future__ import annotations

import random
import time

import numpy as np

from moecache import policies
from moecache.intervals import bootstrap_ratio, paired_difference
from moecache.records.batch import layer_number
from moecache.records.demand import Demand

REFERENCE = "lru"


def fresh(rules: dict, capacity: int, demand: Demand, layer) -> list:
    """A new policy of every rule for one stream, placed on its layer as the harness does."""
    made = []
    for name, params in rules.values():
        policy = policies.make(name, capacity, demand.num_experts, demand.top_k, params)
        policy.layer = layer  # next-use reads the model of its layer
        policy.reset()
        made.append(policy)
    return made


def time_stream(demand: Demand, s: int, rules: dict, capacity: int, turns: random.Random):
    """Nanoseconds each rule's change() took over stream `s`, the rules interleaved per token."""
    live = fresh(rules, capacity, demand, layer_number(demand.streams[s]))
    resident = [{} for _ in live]  # expert -> None: a keys view, as the harness's pool gives
    spent = np.zeros(len(live), dtype=np.int64)
    probs = demand.probs
    for t in range(int(demand.lengths[s])):
        request = demand.requests[s, t].tolist()
        row = None if probs is None else probs[s, t]
        for i in turns.sample(range(len(live)), len(live)):
            policy, held = live[i], resident[i]
            given = row if policy.needs_probs else None
            start = time.perf_counter_ns()
            change = policy.change(t, request, given, held.keys())
            spent[i] += time.perf_counter_ns() - start
            for e in change.evict:
                del held[e]
            held.update(dict.fromkeys(change.admit))
    return spent


def stream_times(demand: Demand, rules: dict, capacity: int, rounds: int, seed: int):
    """[rules, streams] nanoseconds per stream, the median of `rounds` passes."""
    turns = random.Random(seed)
    passes = np.array(
        [
            [time_stream(demand, s, rules, capacity, turns) for s in range(len(demand.streams))]
            for _ in range(rounds)
        ]
    )  # [rounds, streams, rules]
    return np.median(passes, axis=0).T


def cost(demand: Demand, rules: dict, copies: dict, tau_ms: float, *, capacity, rounds, seed):
    """Per rule (label -> (name, params); LRU added first): ns per decision and its
    interval over streams, the extra ns over LRU's (paired), copies saved per decision
    (`copies`: label -> copies over `demand` at the capacity timed) and their worth at
    `tau_ms` a copy, and what is left (worth less extra; negative: it costs more than it
    saves)."""
    rules = {REFERENCE: (REFERENCE, {}), **rules}
    ns = dict(zip(rules, stream_times(demand, rules, capacity, rounds, seed), strict=True))
    decisions = demand.lengths.astype(float)
    total = float(decisions.sum())
    out = {}
    for label, spent in ns.items():
        extra, extra_interval = paired_difference(spent, decisions, ns[REFERENCE], decisions, seed)
        saved = (copies[REFERENCE] - copies[label]) / total
        worth = saved * tau_ms * 1e6
        out[label] = {
            "ns_per_decision": float(spent.sum() / total),
            "interval": bootstrap_ratio(spent, decisions, seed),
            "extra_ns": extra,
            "extra_interval": extra_interval,
            "copies_saved_per_decision": saved,
            "worth_ns": worth,
            "net_ns": worth - extra,
            "net_interval": [worth - extra_interval[1], worth - extra_interval[0]],
        }
    return {"decisions": int(total), "streams": len(demand.streams), "rules": out}
