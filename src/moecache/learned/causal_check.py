"""The causal rules checked where they run: their closed-loop copies against their replay,
and their decisions' cost against the copies they save (one CausalCheck record).

The learned closed-loop job decodes every rule of the causal study (stage.causal_runs) on
the first learned.causal.closed_loop.sequences sequences of each shard named there; here
each run's copies per sequence are compared with the same rule replayed on those sequences
of the shard's trace (learned/causal.py's copies: next-use with each layer's model), which
must be equal, exactly. Then learned/causal_cost.py times every rule against LRU on the
first learned.causal.cost.sequences sequences of the first closed-loop shard's trace.
"""

from __future__ import annotations

from moecache.costs.equation import tau_1x
from moecache.errors import MoecacheError
from moecache.learned import causal, causal_cost, stage
from moecache.records.demand import Demand, subset


def first_sequences(demand: Demand, count: int) -> Demand:
    """The streams of `demand`'s first `count` sequences (in trace order)."""
    kept = set(list(dict.fromkeys(demand.sequences))[:count])
    return subset(demand, [s for s, name in enumerate(demand.sequences) if name in kept])


def harness_copies(report: dict) -> dict[str, int]:
    """A closed-loop run's copies per sequence, named as the trace names them."""
    return {f"seq{row['sequence']}": row["fills"] + row["steady"] for row in report["sequences"]}


def closed_vs_replay(demand: Demand, reports: list[dict], capacity: int) -> dict:
    """Per causal rule decoded closed loop (`reports`, its runs' results), its copies per
    sequence beside its replay's on the same sequences of `demand`."""
    out = {}
    for report in reports:
        loop = harness_copies(report)
        cut = subset(demand, [s for s, name in enumerate(demand.sequences) if name in loop])
        text = causal.rule_text(report["policy"], report["params"])
        replay = causal.copies(cut, text, capacity)
        out[report["policy"]] = {
            "closed_loop": loop,
            "replay": replay,
            "copies": sum(loop.values()),
            "replay_copies": sum(replay.values()),
            "equal": loop == replay,
        }
    return out


def causal_reports(reports: list[dict], shard: str, study) -> list[dict]:
    """`shard`'s closed-loop runs of the causal rules; every rule of the study must be there."""
    mine = [r for r in reports if r["shard"] == shard and r["run"].startswith(stage.CAUSAL)]
    missing = set(stage.causal_runs(study)) - {r["run"] for r in mine}
    if missing:
        raise MoecacheError(
            f"shard {shard}: no closed-loop run of {', '.join(sorted(missing))} "
            "(learned.causal.closed_loop decodes them in the learned closed-loop job)"
        )
    return mine


def check(settings, study, traces: dict[str, Demand], reports: list[dict], bandwidth) -> dict:
    """The CausalCheck record's fields (stamped by the command): `traces` per closed-loop
    shard, `reports` the closed-loop runs' results, `bandwidth` the bandwidth record."""
    spec, seed = settings["learned"]["causal"], settings["seed"]
    if "closed_loop" not in spec or "cost" not in spec:
        raise MoecacheError("learned-causal-check: learned.causal names no closed_loop and cost")
    capacity = settings["harness"]["capacity"]
    shards = spec["closed_loop"]["shards"]
    if set(traces) != set(shards):
        raise MoecacheError(f"--trace: give the trace of every shard of {shards}, no other")
    closed = {
        shard: closed_vs_replay(traces[shard], causal_reports(reports, shard, study), capacity)
        for shard in shards
    }
    timed = first_sequences(traces[shards[0]], spec["cost"]["sequences"])
    rules = {label.removeprefix(stage.CAUSAL): r for label, r in stage.causal_runs(study).items()}
    rules = {label: (r["policy"], r["params"]) for label, r in rules.items()}
    copies = {
        label: sum(causal.copies(timed, causal.rule_text(*rule), capacity).values())
        for label, rule in {causal_cost.REFERENCE: (causal_cost.REFERENCE, {}), **rules}.items()
    }
    tau = tau_1x(bandwidth)
    rounds = spec["cost"]["rounds"]
    return {
        "seed": seed,
        "capacity": capacity,
        "closed_loop": closed,
        "cost_shard": shards[0],
        "cost_sequences": list(dict.fromkeys(timed.sequences)),
        "rounds": rounds,
        "tau_ms": tau,
        "cost": causal_cost.cost(
            timed, rules, copies, tau, capacity=capacity, rounds=rounds, seed=seed
        ),
    }
