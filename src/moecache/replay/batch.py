"""Batched demand from a batch-1 trace: B sequences decode together and share each layer's
pool, so at each step a layer requests the union of the experts its running sequences
chose (docs/batching.md).

Teacher-forced routing of one sequence does not depend on the others in its batch, so the
union of batch-1 demand is the batched demand exactly. Static batching takes the
sequences B at a time in trace order, aligned at their first token, each batch a new
stream (an empty pool); continuous batching refills a finished sequence's place with the
next sequence at once, one stream for the whole shard. A union row is padded with PAD.

A step whose union exceeds the pool's C slots is served in rounds of at most C experts:
the union's resident experts first, then the rest, each in ascending id, C at a time;
each round is one request the rule serves (resident while it computes).

Prefill P > 0 (static batching): each sequence's first P tokens are one prompt processed
in one forward, so a stream's step 0 requests the union of the experts of its sequences'
first P tokens (served in rounds when wider than C), and decoding (token P onward) starts
from the pool that step left; the prefill's copies and rounds are reported apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moecache.errors import MoecacheError
from moecache.policies.pools import Pools
from moecache.records.batch import MODES, collapse, future, layer_of, places, rounds, stack, union
from moecache.records.demand import PAD, Demand, padded
from moecache.records.shape import check_shape
from moecache.replay import engine


@dataclass
class Batched(Demand):
    """Union streams: one per layer and batch (static) or per layer (continuous)."""

    size: int = 1
    batching: str = "static"
    sequence_tokens: int = 0  # the batch-1 demand's timed tokens (copies count against them)
    members: list[list[str]] = field(default_factory=list)  # sequences of each stream
    prefill: int = 0  # prompt tokens processed in step 0 (0: none)

    def check_capacity(self, capacity: int) -> None:
        """Only the range: a union wider than the pool is served in rounds."""
        check_shape(None, capacity, self.num_experts, where=f"--capacity {capacity}")

    def check_fits(self, capacity: int) -> None:
        """Refuse, in one line, unions wider than the pool (for the bounds and the LP)."""
        check_shape(
            self.top_k or None,
            capacity,
            where=f"--batch {self.size}",
            note="top-k is a step's widest union: the bounds and the LP need every union to "
            "fit (replay serves it in rounds: docs/batching.md)",
        )


def prefilled(demand: Demand, prefill: int) -> Demand:
    """`demand` with each stream's first `prefill` tokens as one step (collapse)."""
    if prefill < 0:
        raise MoecacheError(f"--prefill {prefill}: must be at least 0")
    if prefill == 0:
        return demand
    short = [q for q, n in zip(demand.sequences, demand.lengths, strict=True) if n <= prefill]
    if short:
        raise MoecacheError(
            f"--prefill {prefill}: sequence {short[0]} has no token left to decode "
            f"({len(set(short))} sequences are not longer than P)"
        )
    rows = [collapse(demand.requests[s, :n], prefill) for s, n in enumerate(demand.lengths)]
    requests, lengths = padded(rows, prefill * demand.top_k)
    return Demand(
        demand.streams, demand.sequences, requests, lengths, demand.num_experts, None, demand.origin
    )


def batched(demand: Demand, size: int, batching: str = "static", prefill: int = 0) -> Batched:
    """The union streams of `demand`'s sequences decoded `size` at a time, each one's
    first `prefill` tokens in one step."""
    if size < 1:
        raise MoecacheError(f"--batch {size}: must be at least 1")
    if batching not in MODES:
        raise MoecacheError(f"--batching {batching}: known are {', '.join(MODES)}")
    if prefill and batching != "static":
        raise MoecacheError(f"--prefill {prefill}: defined for static batching only")
    demand = prefilled(demand, prefill)
    order = list(dict.fromkeys(demand.sequences))  # trace order
    layers: dict[str, dict[str, int]] = {}
    for s, (name, sequence) in enumerate(zip(demand.streams, demand.sequences, strict=True)):
        layers.setdefault(layer_of(name), {})[sequence] = s
    names, batches, rows, members = [], [], [], []
    for layer, stream_of in layers.items():
        present = [q for q in order if q in stream_of]
        placed = places([int(demand.lengths[stream_of[q]]) for q in present], size, batching)
        for b in sorted({b for b, _, _ in placed}):
            group = [(q, *p[1:]) for q, p in zip(present, placed, strict=True) if p[0] == b]
            tag = f"batch{b}" if batching == "static" else "continuous"
            names.append(f"{layer}/{tag}")
            batches.append(tag)
            rows.append(union(demand, [(stream_of[q], slot, at) for q, slot, at in group], size))
            members.append([q for q, _, _ in group])
    requests, lengths = stack(rows)
    return Batched(
        names,
        batches,
        requests,
        lengths,
        demand.num_experts,
        None,
        demand.origin,
        size,
        batching,
        demand.timed_tokens,  # prefilled: each sequence's tokens from P on
        members,
        prefill,
    )


def serve(demand: Batched, text: str, capacity: int) -> engine.Counts:
    """The counts of rule `text` over every union stream, each step served in rounds. A
    rule is built for requests of at most min(W, C) experts, W the widest union."""
    return served(demand, text, capacity)[0]


def served(demand: Batched, text: str, capacity: int):
    """serve's counts (prefill included), and per stream the prefill step's copies and
    rounds (zero without prefill)."""
    policy = engine.make_rule(text, demand, capacity, top_k=min(demand.top_k, capacity))
    streams = [one_stream(demand, s, policy, capacity) for s in range(len(demand.streams))]
    width = max((len(c) for c, _, _ in streams), default=0)
    copies = np.zeros((len(streams), width), dtype=np.int64)
    full = np.zeros((len(streams), width), dtype=bool)
    for s, (c, f, _) in enumerate(streams):
        copies[s, : len(c)], full[s, : len(f)] = c, f
    first = np.array([r if demand.prefill else 0 for _, _, r in streams], dtype=np.int64)
    apart = {
        "prefill_copies": np.array(
            [sum(c[:r]) for (c, _, _), r in zip(streams, first, strict=True)]
        ),
        "prefill_rounds": first,
    }
    return engine.tally(copies, full, capacity, demand), apart


def one_stream(demand: Batched, s: int, policy, capacity: int) -> tuple[list, list, int]:
    """Copies of each round of stream s, whether its pool was full before the round, and
    how many rounds its first step took."""
    requests = demand.requests[s, : demand.lengths[s]]
    policy.reset(future(requests) if policy.needs_future else None, streams=1)
    pools = Pools(1, demand.num_experts, capacity)
    copies, full, first = [], [], 0
    for t, row in enumerate(requests):
        for part in rounds(row[row != PAD], pools.resident[0], capacity):
            full.append(bool(pools.count[0] == capacity))
            step = policy.step(t, part[None], None, pools)
            pools.apply(1, step)
            copies.append(int(step.copies[0]))
        if t == 0:
            first = len(copies)
    return copies, full, first


def report(demand: Demand, capacity: int, rules, size: int, batching: str, prefill=0) -> dict:
    """engine.report of the batched demand: copies per sequence-token, the batch stated;
    with prefill, each rule's prefill copies and rounds apart (per stream and in total)."""
    union_demand = batched(demand, size, batching, prefill)
    apart: dict = {}

    def replay(part, text, capacity):
        counts, apart[text] = served(part, text, capacity)
        return counts

    out = engine.report_parts(
        [union_demand], capacity, rules, replay=replay, timed=union_demand.sequence_tokens
    )
    if prefill:
        for text, r in out["rules"].items():
            add_prefill(r, apart[text])
    return {**out, "batch": described(union_demand, capacity)}


def add_prefill(rule: dict, apart: dict) -> None:
    """A rule's report gains, per stream and in total, the prefill's copies and rounds and
    decoding's copies (insertions less the prefill's)."""
    for s, row in enumerate(rule["streams"]):
        row.update({key: int(values[s]) for key, values in apart.items()})
        row["decode_copies"] = row["insertions"] - row["prefill_copies"]
    for key in (*apart, "decode_copies"):
        rule["totals"][key] = sum(row[key] for row in rule["streams"])


def described(demand: Batched, capacity: int) -> dict:
    widths = (demand.requests != PAD).sum(axis=2)
    prefill = {"prefill": demand.prefill} if demand.prefill else {}
    return {
        **prefill,
        "size": demand.size,
        "batching": demand.batching,
        "widest_union": demand.top_k,
        "steps": int(demand.lengths.sum()),
        "steps_in_rounds": int((widths > capacity).sum()),
        "sequence_tokens": demand.sequence_tokens,
    }


def curve(demand: Demand, capacity: int, ks: list[int], heldout_last: int, size, batching):
    """foresight.curve of the batched demand; held out are the last `heldout_last` batches."""
    from moecache.replay import foresight

    union_demand = batched(demand, size, batching)
    out = foresight.curve_parts([union_demand], capacity, ks, heldout_last, replay=serve)
    return {**out, "batch": described(union_demand, capacity)}


def fitting(demand: Demand, size: int, batching: str, capacity: int) -> Batched:
    """The batched demand for the bounds and the LP: every union must fit the pool."""
    union_demand = batched(demand, size, batching)
    union_demand.check_fits(capacity)
    return union_demand
