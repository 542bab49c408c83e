"""Batched teacher-forced decoding with the KV cache: B sequences step through the model
together, each layer's pooled block serving the union of their experts (union_block.py).

Static batching, as the batched replay defines it (replay/batch.py, docs/batching.md): the
sequences B at a time in order, aligned at their first token; a sequence that ends leaves
the batch (its rows of the KV cache are dropped), and the batch ends with its longest;
each batch starts with an empty pool. Only lossless eviction rules that read no router
probabilities run: a union has no single router distribution, and restricting policies
(one allowed set shared by the batch) are not built yet, so they are refused in one line.

Results have the shape of decode.decode's per arm, with a batch as the unit a row of
`totals` counts (copies belong to a batch, not to one of its sequences): per sequence its
NLL and its share of each step's time (a step's seconds split over the sequences running
in it); per batch its counts, copies per layer, and each step's seconds and running
sequences. The first step of a batch fills the empty pool and is not timed, as a
sequence's first token at batch one.

Prefill P > 0: the batch's first P tokens go through the model in one forward (one union
of every row and position per layer, served in rounds when wider than C), its copies and
seconds reported apart (`prefill_copies`, `prefill_rounds`, `prefill_seconds`); decoding
then steps token by token from token P with the KV cache and the pools the prefill left,
every decoding step timed.
"""

from __future__ import annotations

import numpy as np
import torch

from moecache.errors import MoecacheError
from moecache.harness import decode
from moecache.harness.timing import Stopwatch
from moecache.policies import EvictionPolicy
from moecache.replay import batch as replay_batch
from moecache.replay.demand import Demand, padded


def check_arm(arm: decode.Arm, size: int) -> None:
    """One line for a policy the union block cannot run."""
    for block in arm.blocks.values():
        policy = block.policy
        if not isinstance(policy, EvictionPolicy) or policy.needs_probs or policy.needs_hidden:
            raise MoecacheError(
                f"run {arm.name}: policy {policy.name} restricts routing or reads the router; "
                f"batched decoding (B = {size}) runs lossless eviction rules that read neither"
            )


def decode_batched(
    model,
    sequences,
    device,
    arm: decode.Arm,
    own: dict,
    size: int,
    futures=None,
    seed=0,
    prefill=0,
) -> dict:
    """Every sequence under `arm` (built with union_block.UnionBlock), `size` at a time,
    each batch's first `prefill` tokens in one forward; `own`: the model's own blocks, put
    back afterwards. `futures[layer][sequence]`: batch-one demand, for rules that read
    ahead."""
    if size < 1:
        raise MoecacheError(f"--batch {size}: must be at least 1")
    if prefill < 0 or any(len(ids) <= prefill for ids in sequences):
        raise MoecacheError(
            f"--prefill {prefill}: must be at least 0, and every sequence longer than it"
        )
    check_arm(arm, size)
    if any(block.policy.needs_future for block in arm.blocks.values()) and futures is None:
        raise MoecacheError(f"run {arm.name}: reads ahead, and no batch-one demand was given")
    decode.use(model, arm, own)
    try:
        seq_rows, batch_rows, trace = batches(
            model, sequences, device, arm, (size, prefill), futures
        )
    finally:
        decode.use(model, decode.Arm("own", {}), own)
    for row in seq_rows:
        row["nll"] = row["nll_sum"] / row["scored"]
    totals = decode.totals(batch_rows, 1, seed)
    if prefill:  # the prefill's copies and seconds, apart from decoding's
        for key in ("prefill_copies", "prefill_rounds", "prefill_seconds"):
            totals[key] = sum(row[key] for row in batch_rows)
    return {
        "sequences": seq_rows,
        "batches": batch_rows,
        "totals": {**totals, "batch": described((size, prefill), trace, arm, batch_rows)},
        "trace": trace,
    }


def batches(model, sequences, device, arm: decode.Arm, shape: tuple[int, int], futures):
    """Rows per sequence, rows per batch, the union trace: the static batches in order.
    `shape`: (B, P)."""
    size, prefill = shape
    seq_rows, batch_rows, trace = [], [], []
    experts = next(iter(arm.blocks.values())).num_experts
    for b, start in enumerate(range(0, len(sequences), size)):
        members = list(range(start, min(start + size, len(sequences))))
        future = None
        if futures is not None:
            future = union_futures(futures, members, shape, experts)
        texts = [sequences[i] for i in members]
        row, rows, steps = decode_batch(model, arm, texts, device, future, prefill)
        batch_rows.append({"batch": b, "members": members, **row})
        seq_rows += [
            {"sequence": i, "batch": b, "slot": j, **r}
            for j, (i, r) in enumerate(zip(members, rows, strict=True))
        ]
        trace += [{"batch": b, **step} for step in steps]
    return seq_rows, batch_rows, trace


def described(shape, trace: list[dict], arm: decode.Arm, batch_rows: list[dict]) -> dict:
    """The `batch` fields, as the batched replay's report names them; `shape`: (B, P)."""
    size, prefill = shape
    capacity = next(iter(arm.blocks.values())).pool.capacity
    widths = [len(step["requested"]) for step in trace]
    return {
        **({"prefill": prefill} if prefill else {}),
        "size": size,
        "batching": "static",
        "widest_union": max(widths, default=0),
        "steps": len(trace),
        "steps_in_rounds": sum(w > capacity for w in widths),
        "sequence_tokens": sum(row["timed_tokens"] for row in batch_rows),
    }


def union_futures(futures: dict, members: list[int], shape, experts: int) -> dict:
    """Per layer the batch's union demand [T, W] from the members' batch-one demand, built
    by the batched replay itself (replay.batch.collapse for the prefill, replay.batch.union,
    then its future's padding); `shape`: (B, P)."""
    size, prefill = shape
    out = {}
    for layer, per_sequence in futures.items():
        tokens = [np.asarray(per_sequence[i], dtype=np.int64) for i in members]
        if prefill:
            tokens = [replay_batch.collapse(t, prefill) for t in tokens]
        requests, lengths = padded(tokens, tokens[0].shape[1])
        names = [str(i) for i in members]
        demand = Demand(names, names, requests, lengths, experts)
        rows = replay_batch.union(demand, [(s, s, 0) for s in range(len(members))], size)
        out[layer] = replay_batch.future(rows)[0]
    return out


@torch.inference_mode()
def decode_batch(model, arm: decode.Arm, members: list, device, future=None, prefill=0):
    """One static batch: (its row, one row per member, its steps per layer); its first
    `prefill` tokens in one forward."""
    from transformers import DynamicCache

    for layer, block in arm.blocks.items():
        block.reset(None if future is None else future[layer])
        block.pool.clear_counts()
    lengths = [len(ids) for ids in members]
    state = {"nll": [0.0] * len(members), "share": [0.0] * len(members), "first": {}}
    state.update(step_seconds=[], running=[], prefill=prefill, rounds={}, prefill_seconds=0.0)
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
        logits, seconds = timed_forward(model, arm, x, cache, watch)
        score(state, logits, members, running, t)
        if t == 0:  # the first step fills the empty pools and is not timed
            state["first"] = {layer: counts(b.pool) for layer, b in arm.blocks.items()}
            for block in arm.blocks.values():
                block.pool.clear_counts()
            continue
        state["step_seconds"].append(seconds)
        state["running"].append(len(running))
        for i in running:
            state["share"][i] += seconds / len(running)
    return batch_row(arm, members, state), member_rows(members, state), steps_of(arm)


def timed_forward(model, arm: decode.Arm, x, cache, watch):
    """The logits of one forward and its seconds (the copies a charged link waits for in)."""
    charged = sum(block.pool.charged for block in arm.blocks.values())
    watch.start()
    logits = model(input_ids=x, cache=cache, use_cache=True).logits
    seconds = watch.stop()  # waits for the device, so the copy timers can be read
    # A charged link's time is in its laps and, here, in the step that copied.
    return logits, seconds + sum(block.pool.charged for block in arm.blocks.values()) - charged


def prefill_batch(model, arm: decode.Arm, members: list, where: tuple, state: dict) -> None:
    """The members' first P tokens in one forward (`where`: device, KV cache, stopwatch):
    their NLLs, its seconds, and per layer its copies and rounds, counted apart."""
    device, cache, watch = where
    prefill = state["prefill"]
    x = torch.tensor([ids[:prefill] for ids in members], device=device)
    logits, state["prefill_seconds"] = timed_forward(model, arm, x, cache, watch)
    logp = torch.log_softmax(logits.float(), -1)
    for r, ids in enumerate(members):  # position t scores token t + 1 (every one is longer)
        state["nll"][r] -= sum(logp[r, t, ids[t + 1]].item() for t in range(prefill))
    state["first"] = {layer: counts(b.pool) for layer, b in arm.blocks.items()}
    state["rounds"] = {layer: b.trace[-1][3] for layer, b in arm.blocks.items()}
    for block in arm.blocks.values():
        block.pool.clear_counts()


def score(state: dict, logits, members, running, t: int) -> None:
    """Add each running sequence's next-token NLL at step t."""
    logp = torch.log_softmax(logits[:, -1].float(), -1)
    for r, i in enumerate(running):
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
