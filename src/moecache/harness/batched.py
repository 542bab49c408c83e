"""Batched teacher-forced decoding with the KV cache: B sequences step through the model
together, each layer's pooled block serving the union of their experts (union_block.py).

Batching as the batched replay defines it (records/batch.py, docs/batching.md):
- static (here): the sequences B at a time in order, aligned at their first token; a
  sequence that ends leaves the batch (its rows of the KV cache are dropped), and the batch
  ends with its longest; each batch starts with an empty pool.
- continuous (continuous.py): a finished sequence's slot is refilled at once by the next
  sequence, one pool and policy stream for the whole shard.

Lossless rules that read no router probabilities run (eviction rules, the all-resident
pool), and so do scheduled restricting policies (dwell, static), which hold one allowed set
for the whole batch; policies that read router probabilities, hidden states or a per-token
future are refused in one line (policy_factory, check_arm): a union has no single router
distribution.

Results have the shape of decode.decode's per arm, with a batch as the unit a row of
`totals` counts (copies belong to a batch, not to one of its sequences): per sequence its
NLL and its share of each step's time (a step's seconds split over the sequences running
in it); per batch its counts, copies per layer, and each step's seconds and running
sequences. The first step of a batch (of the continuous stream) fills the empty pool and is
not timed, as a sequence's first token at batch one.

Prefill P > 0 (static only): the batch's first P tokens go through the model in one forward
(one union of every row and position per layer, served in rounds when wider than C), its
copies and seconds reported apart (`prefill_copies`, `prefill_rounds`, `prefill_seconds`);
decoding then steps token by token from token P with the KV cache and the pools the
prefill left, every decoding step timed.
"""

from __future__ import annotations

import numpy as np
import torch

from moecache import policies
from moecache.errors import MoecacheError
from moecache.harness import decode
from moecache.harness.timing import Stopwatch
from moecache.policies import EvictionPolicy
from moecache.policies.all_resident import AllResident
from moecache.policies.scheduled import ScheduledPolicy
from moecache.records import batch as geometry
from moecache.records.demand import Demand, padded


def refusal(policy) -> str | None:
    """Why the union block cannot run `policy` (None: it can)."""
    lossless = isinstance(policy, (EvictionPolicy, AllResident))
    # A scheduled policy's future is per token ([T, k]); a union stream has none.
    scheduled = isinstance(policy, ScheduledPolicy) and not policy.needs_future
    if (lossless or scheduled) and not (policy.needs_probs or policy.needs_hidden):
        return None
    return (
        f"policy {policy.name} reads the router's probabilities, hidden states or a future "
        "per token; batched decoding runs lossless rules and scheduled restricting policies "
        "(dwell, static) that read none"
    )


def check_arm(arm: decode.Arm, size: int) -> None:
    """One line for a policy the union block cannot run."""
    for block in arm.blocks.values():
        why = refusal(block.policy)
        if why:
            raise MoecacheError(f"run {arm.name} (B = {size}): {why}")


def policy_factory(spec: dict, capacity: int, num_experts: int, top_k: int, size: int, widest=None):
    """A zero-argument factory of fresh policies `spec` for the union block at batch
    `size`; `widest`: the widest union where known (read off the batch-one trace, as the
    replay builds rules), else size * top_k, the widest possible. Refuses, in one line, a
    policy the union block cannot run."""
    width = min(widest or size * top_k, num_experts)
    name, params = spec["policy"], spec["params"]

    def make():
        # A lossless rule serves requests of at most min(W, C) experts (a round is at most C).
        policy = policies.make(name, capacity, num_experts, min(width, capacity), params)
        if policy.restricts:
            # A scheduled policy plans once on the whole union, which may be wider than C
            # (and, at prefill, than any W): its top_k only spaces its recency keys (one
            # request spans top_k of them) and never bounds its set (C does), so N, the
            # widest any union can be, keeps every request's keys in order.
            policy.top_k = num_experts
        return policy

    why = refusal(make())  # fails now, with one line, on a bad name or parameter too
    if why:
        raise MoecacheError(f"--batch {size}: {why}")
    return make


def check_shape(sequences, size: int, batching: str, prefill: int) -> None:
    """One line for a batch size, batching or prefill the harness cannot decode."""
    if size < 1:
        raise MoecacheError(f"--batch {size}: must be at least 1")
    if batching not in geometry.MODES:
        raise MoecacheError(f"--batching {batching}: known are {', '.join(geometry.MODES)}")
    if prefill and batching != "static":
        raise MoecacheError(f"--prefill {prefill}: defined for static batching only")
    if prefill < 0 or any(len(ids) <= prefill for ids in sequences):
        raise MoecacheError(
            f"--prefill {prefill}: must be at least 0, and every sequence longer than it"
        )


def batches(model, sequences, device, arm: decode.Arm, shape: tuple[int, int], futures):
    """Rows per sequence, rows per batch, the union trace: the static batches in order.
    `shape`: (B, P)."""
    size, prefill = shape
    seq_rows, batch_rows, trace = [], [], []
    for b, start in enumerate(range(0, len(sequences), size)):
        members = list(range(start, min(start + size, len(sequences))))
        future = None
        if futures is not None:
            placed = [(slot, 0) for slot in range(len(members))]  # aligned at their first
            future = union_futures(futures, members, placed, shape, experts_of(arm))
        texts = [sequences[i] for i in members]
        row, rows, steps = decode_batch(model, arm, texts, device, future, prefill)
        batch_rows.append({"batch": b, "members": members, **row})
        seq_rows += [
            {"sequence": i, "batch": b, "slot": j, **r}
            for j, (i, r) in enumerate(zip(members, rows, strict=True))
        ]
        trace += [{"batch": b, **step} for step in steps]
    return seq_rows, batch_rows, trace


def experts_of(arm: decode.Arm) -> int:
    return next(iter(arm.blocks.values())).num_experts


def described(shape, trace: list[dict], arm: decode.Arm, batch_rows: list[dict]) -> dict:
    """The `batch` fields, as the batched replay's report names them; `shape`: (B, P,
    batching)."""
    size, prefill, batching = shape
    return {
        **({"prefill": prefill} if prefill else {}),
        "size": size,
        "batching": batching,
        "widest_union": max((len(step["requested"]) for step in trace), default=0),
        "steps": len(trace),
        "steps_in_rounds": sum(step["rounds"] > 1 for step in trace),
        "sequence_tokens": sum(row["timed_tokens"] for row in batch_rows),
    }


def union_futures(futures: dict, members: list[int], placed: list, shape, experts: int) -> dict:
    """Per layer the stream's union demand [T, W] from the members' batch-one demand, built
    by the batched replay itself (records.batch.collapse for the prefill, records.batch.union,
    then its future's padding); `placed`: each member's (slot, first step); `shape`: (B, P)."""
    size, prefill = shape
    out = {}
    for layer, per_sequence in futures.items():
        tokens = [np.asarray(per_sequence[i], dtype=np.int64) for i in members]
        if prefill:
            tokens = [geometry.collapse(t, prefill) for t in tokens]
        requests, lengths = padded(tokens, tokens[0].shape[1])
        names = [str(i) for i in members]
        demand = Demand(names, names, requests, lengths, experts)
        group = [(s, slot, at) for s, (slot, at) in enumerate(placed)]
        rows = geometry.union(demand, group, size)
        out[layer] = geometry.future(rows)[0]
    return out


def start(arm: decode.Arm, future, members: list, prefill: int = 0) -> dict:
    """Empty pools and fresh policies for a new stream; its decoding state."""
    for layer, block in arm.blocks.items():
        block.reset(None if future is None else future[layer])
        block.pool.clear_counts()
    n = len(members)
    state = {"nll": [0.0] * n, "share": [0.0] * n, "first": {}, "step_seconds": []}
    state.update(running=[], prefill=prefill, rounds={}, prefill_seconds=0.0)
    return state


@torch.inference_mode()
def decode_batch(model, arm: decode.Arm, members: list, device, future=None, prefill=0):
    """One static batch: (its row, one row per member, its steps per layer); its first
    `prefill` tokens in one forward."""
    from transformers import DynamicCache

    state = start(arm, future, members, prefill)
    lengths = [len(ids) for ids in members]
    cache, running = DynamicCache(config=model.config), list(range(len(members)))
    watch = Stopwatch(device)
    if prefill:
        prefill_batch(model, arm, members, (device, cache, watch), state)
    for t in range(prefill, max(lengths)):
        alive = [i for i in running if t < lengths[i]]
        if alive != running:  # the ended sequences leave the batch and its KV cache
            keep = [running.index(i) for i in alive]
            cache.batch_select_indices(torch.tensor(keep, device=device))
            running = alive
        x = torch.tensor([[members[i][t]] for i in running], device=device)
        logits, seconds = timed_forward(model, arm, {"input_ids": x, "cache": cache}, watch)
        score(state, logits, members, [(i, t) for i in running])
        stepped(state, arm, t == 0, seconds, running)
    return batch_row(arm, members, state), member_rows(members, state), steps_of(arm)


def timed_forward(model, arm: decode.Arm, inputs: dict, watch):
    """The logits of one forward of `inputs` (with the KV cache) and its seconds (the copies
    a charged link waits for in)."""
    charged = sum(block.pool.charged for block in arm.blocks.values())
    watch.start()
    logits = model(**inputs, use_cache=True).logits
    seconds = watch.stop()  # waits for the device, so the copy timers can be read
    # A charged link's time is in its laps and, here, in the step that copied.
    return logits, seconds + sum(block.pool.charged for block in arm.blocks.values()) - charged


def stepped(state: dict, arm: decode.Arm, first: bool, seconds: float, running) -> None:
    """After a decoding step: a stream's first step fills the empty pools and is not timed
    (its counts kept apart); the others' seconds are split over the running sequences."""
    if first:
        state["first"] = {layer: counts(b.pool) for layer, b in arm.blocks.items()}
        for block in arm.blocks.values():
            block.pool.clear_counts()
        return
    state["step_seconds"].append(seconds)
    state["running"].append(len(running))
    for i in running:
        state["share"][i] += seconds / len(running)


def prefill_batch(model, arm: decode.Arm, members: list, where: tuple, state: dict) -> None:
    """The members' first P tokens in one forward (`where`: device, KV cache, stopwatch):
    their NLLs, its seconds, and per layer its copies and rounds, counted apart."""
    device, cache, watch = where
    prefill = state["prefill"]
    x = torch.tensor([ids[:prefill] for ids in members], device=device)
    inputs = {"input_ids": x, "cache": cache}
    logits, state["prefill_seconds"] = timed_forward(model, arm, inputs, watch)
    logp = torch.log_softmax(logits.float(), -1)
    for r, ids in enumerate(members):  # position t scores token t + 1 (every one is longer)
        state["nll"][r] -= sum(logp[r, t, ids[t + 1]].item() for t in range(prefill))
    state["first"] = {layer: counts(b.pool) for layer, b in arm.blocks.items()}
    state["rounds"] = {layer: b.steps()[-1]["rounds"] for layer, b in arm.blocks.items()}
    for block in arm.blocks.values():
        block.pool.clear_counts()


def score(state: dict, logits, members, rows: list[tuple[int, int]]) -> None:
    """Add each row's next-token NLL; `rows`: per row of the logits, (member, position)."""
    logp = torch.log_softmax(logits[:, -1].float(), -1)
    for r, (i, t) in enumerate(rows):
        if t + 1 < len(members[i]):
            state["nll"][i] -= logp[r, members[i][t + 1]].item()


def counts(pool) -> dict:
    return {"fills": pool.fills, "steady": pool.steady}


def batch_row(arm: decode.Arm, members: list, state: dict) -> dict:
    pools = {layer: block.pool for layer, block in arm.blocks.items()}
    layers = {}
    for layer, pool in pools.items():
        first = state["first"][layer]
        fills, steady = first["fills"] + pool.fills, first["steady"] + pool.steady
        layers[layer] = {"insertions": fills + steady, "fills": fills, "steady": steady}
        if state["prefill"]:
            copies = first["fills"] + first["steady"]
            layers[layer].update(prefill_copies=copies, prefill_rounds=state["rounds"][layer])
            layers[layer]["decode_copies"] = fills + steady - copies
    untimed = max(state["prefill"], 1)  # tokens before the first timed step
    return {
        **prefill_fields(state, layers),
        "tokens": sum(map(len, members)),
        "nll_sum": sum(state["nll"]),
        "scored": sum(len(ids) - 1 for ids in members),
        "timed_tokens": sum(len(ids) - untimed for ids in members),
        "step_seconds": sum(state["step_seconds"]),
        "copy_seconds": sum(lap.seconds() for p in pools.values() for lap in p.laps),
        "timed_copies": sum(p.fills + p.steady for p in pools.values()),
        "copy_groups": sum(p.groups for p in pools.values()),
        "fills": sum(c["fills"] for c in layers.values()),
        "steady": sum(c["steady"] for c in layers.values()),
        "layers": layers,
        "step_seconds_each": state["step_seconds"],
        "running_each": state["running"],
    }


def prefill_fields(state: dict, layers: dict) -> dict:
    """A batch's prefill copies, rounds and seconds (none without prefill)."""
    if not state["prefill"]:
        return {}
    return {
        "prefill_copies": sum(c["prefill_copies"] for c in layers.values()),
        "prefill_rounds": sum(c["prefill_rounds"] for c in layers.values()),
        "prefill_seconds": state["prefill_seconds"],
    }


def member_rows(members: list, state: dict) -> list[dict]:
    untimed = max(state["prefill"], 1)
    return [
        {
            "tokens": len(ids),
            "nll_sum": state["nll"][i],
            "scored": len(ids) - 1,
            "timed_tokens": len(ids) - untimed,
            "step_seconds": state["share"][i],
        }
        for i, ids in enumerate(members)
    ]


def steps_of(arm: decode.Arm) -> list[dict]:
    return [{"layer": layer, **s} for layer, block in arm.blocks.items() for s in block.steps()]
