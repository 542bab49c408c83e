"""Teacher-forced decoding, batch 1 with the KV cache, over a shard's held-out sequences.

Measures next-token NLL (per sequence and token-weighted), tokens/s, copies, copy time and
compute time; a global warm-up and each sequence's first token are left out of the timing.
"""

from __future__ import annotations

import contextlib

import torch
from tqdm import tqdm

from moecache import policies
from moecache.harness.pool import ExpertPool
from moecache.harness.pooled_block import PooledMoeBlock
from moecache.harness.timing import Stopwatch


@contextlib.contextmanager
def pooled(model, layers, capacity, device, multiplier, make_policy):
    """Replace `mlp` in each restricted layer with a pooled block (yields layer -> block);
    the model's own blocks are put back afterwards."""
    own = {layer: model.model.layers[layer].mlp for layer in layers}
    blocks = {}
    try:
        for layer, mlp in own.items():
            pool = ExpertPool(mlp.experts, capacity, device, multiplier)
            blocks[layer] = PooledMoeBlock(mlp, pool, make_policy(), mlp.experts.act_fn)
            model.model.layers[layer].mlp = blocks[layer]
        yield blocks
    finally:
        for layer, mlp in own.items():
            model.model.layers[layer].mlp = mlp


def next_token_nll_sum(logits: torch.Tensor, x: torch.Tensor) -> float:
    """Summed next-token NLL of one sequence `x` [1, T] from its logits [1, T, V]."""
    return torch.nn.functional.cross_entropy(
        logits[0, :-1].float(), x[0, 1:], reduction="sum"
    ).item()


@torch.inference_mode()
def batched_nll(model, sequences, device) -> float:
    """The independent check: each whole sequence in one forward pass."""
    total, scored = 0.0, 0
    for ids in sequences:
        x = torch.tensor([ids], device=device)
        total += next_token_nll_sum(model(input_ids=x).logits, x)
        scored += len(ids) - 1
    return total / scored


def counters(blocks) -> tuple[int, int, float]:
    pools = [b.pool for b in blocks.values()]
    return (
        sum(p.fills for p in pools),
        sum(p.steady for p in pools),
        sum(p.copy_seconds for p in pools),
    )


@torch.inference_mode()
def decode(
    model, sequences, device, blocks=None, futures=None, warmup_tokens=16, label="decode"
) -> dict:
    """Decode every sequence token by token. `futures[layer][seq]` is the recorded demand
    handed to policies that read the future."""
    from transformers import DynamicCache

    blocks = blocks or {}
    watch = Stopwatch(device)

    def run(ids, seq, timed):
        for layer, block in blocks.items():
            block.reset(futures[layer][seq] if futures else None)
        cache = DynamicCache(config=model.config)
        x = torch.tensor([ids], device=device)
        row = {
            "sequence": seq,
            "tokens": len(ids),
            "nll_sum": 0.0,
            "scored": len(ids) - 1,
            "timed_tokens": 0,
            "step_seconds": 0.0,
            "copy_seconds": 0.0,
            "timed_copies": 0,
        }
        for t in range(len(ids)):
            before = counters(blocks)
            watch.start()
            logits = model(input_ids=x[:, t : t + 1], cache=cache, use_cache=True).logits
            seconds = watch.stop()
            fills, steady, copy_s = (a - b for a, b in zip(counters(blocks), before, strict=True))
            if t + 1 < len(ids):
                row["nll_sum"] -= torch.log_softmax(logits[0, -1].float(), -1)[ids[t + 1]].item()
            if timed and t > 0:
                row["timed_tokens"] += 1
                row["step_seconds"] += seconds
                row["copy_seconds"] += copy_s
                row["timed_copies"] += fills + steady
        return row

    for block in blocks.values():
        block.pool.clear_counts()
    run(sequences[0][: warmup_tokens + 1], 0, timed=False)  # global warm-up, not counted
    for block in blocks.values():
        block.pool.clear_counts()
    rows, traces = [], []
    for seq, ids in enumerate(tqdm(sequences, desc=label, unit="seq")):
        before = counters(blocks)
        row = run(ids, seq, timed=True)
        fills, steady, _ = (a - b for a, b in zip(counters(blocks), before, strict=True))
        row.update(fills=fills, steady=steady, nll=row["nll_sum"] / row["scored"])
        rows.append(row)
        for layer, block in blocks.items():
            traces.extend({"sequence": seq, "layer": layer, **step} for step in block.trace)
    return {"sequences": rows, "totals": totals(rows), "trace": traces}


def totals(rows) -> dict:
    def total(key):
        return sum(r[key] for r in rows)

    timed, steps, copy_s = total("timed_tokens"), total("step_seconds"), total("copy_seconds")
    copies = total("timed_copies")
    return {
        "nll": total("nll_sum") / total("scored"),
        "scored_tokens": total("scored"),
        "timed_tokens": timed,
        "tokens_per_second": timed / steps,
        "fills": total("fills"),
        "steady_copies": total("steady"),
        "rho": total("steady") / timed,
        "tau_ms": 1e3 * copy_s / copies if copies else None,
        "compute_ms": 1e3 * (steps - copy_s) / timed,
        "step_ms": 1e3 * steps / timed,
    }


def policy_factory(spec: dict, capacity: int, num_experts: int, top_k: int):
    def make():
        return policies.make(spec["policy"], capacity, num_experts, top_k, spec.get("params", {}))

    make()  # fail now, with one line, on a bad name or parameter
    return make
