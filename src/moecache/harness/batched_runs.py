"""The batched decode job: harness.batched's runs at one batch size B, at every batching mode
and prefill (runs.batch_shapes), one results file a run and shape
(<out_dir>/<shape>/<run>.json, shape as `b4-static-p0`).

The sequences are the first `harness.batched.sequences` of the first shard, each cut to a
share of its own length, so that they keep the shard's spread of lengths (which is what
tells continuous batching from static) and average `tokens` tokens after the prefill.

Under fan_out `shard` one job decodes every run at every shape of its B, the runs of a
shape one after the other, so that their timings are comparable; under fan_out `run` a job
decodes one run at one shape beside the all-resident run at that shape, its reference on
the same device. A lossless run must keep every sequence's batch-one NLL (the unmodified
model's, one forward a sequence) within the gates' pool tolerance: if one does not, the
job fails with the numbers and writes nothing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moecache import provenance
from moecache.config.keys import capacity_of
from moecache.errors import MoecacheError
from moecache.harness import batched, continuous, decode, decode_totals, gates, link, nll
from moecache.harness.union_block import UnionBlock
from moecache.intervals import bootstrap_ratio
from moecache.model.memory import ring_mib
from moecache.policies.all_resident import AllResident
from moecache.records import trace
from moecache.records.io import write_record
from moecache.records.run import BatchedRunResult
from moecache.runs import BatchShape, batch_shapes


def to_decode(settings: dict, size: int, run: str | None = None, shape=None) -> list:
    """(shape, run names) to decode at B = `size`: every run at every shape, or `run` at
    `shape` beside the all-resident reference; a bad choice refuses in one line."""
    harness = settings["harness"]
    if "batch_sizes" not in harness or size not in harness["batch_sizes"]:
        raise MoecacheError(f"--batch {size}: not one of harness.batch_sizes")
    config = harness["batched"]
    shapes = batch_shapes([size], config)
    if run is None:
        return [(s, list(config["runs"])) for s in shapes]
    if run not in config["runs"]:
        raise MoecacheError(f"--run {run}: not one of harness.batched.runs")
    if shape not in shapes:
        raise MoecacheError(f"--shape {shape}: not one of {', '.join(map(str, shapes))}")
    return [(shape, [reference_name(settings), run])]


def reference_name(settings: dict) -> str:
    """The config's first all-resident run (the reference of a fanned-out job)."""
    runs = settings["harness"]["runs"]
    found = [name for name, spec in runs.items() if spec["policy"] == AllResident.name]
    if not found:
        raise MoecacheError("harness.runs: fan_out run needs an all-resident run as reference")
    return found[0]


def cut(sequences: list, tokens: int, prefill: int) -> list:
    """Each sequence cut to its first P tokens and a share of the rest, the shares in
    proportion to the rest's lengths and averaging `tokens` (at least 2, one timed)."""
    rest = np.array([len(ids) - prefill for ids in sequences], dtype=float)
    short = [i for i, n in enumerate(rest) if n < 2]
    if short:
        raise MoecacheError(
            f"prefill {prefill}: sequence {short[0]} has fewer than 2 tokens after it"
        )
    keep = np.maximum(2, np.rint(rest * tokens / rest.mean())).astype(int)
    return [
        ids[: prefill + min(int(k), len(ids) - prefill)]
        for ids, k in zip(sequences, keep, strict=True)
    ]


def futures_of(full: dict, sequences: list) -> dict:
    """The trace run's batch-one demand per layer and sequence (`full`, as
    trace.read_futures reads it), cut as `sequences` are."""
    return {
        layer: [np.asarray(per[i])[: len(ids)] for i, ids in enumerate(sequences)]
        for layer, per in full.items()
    }


def decode_shapes(settings, model, sequences, trace_path, planned: list) -> dict:
    """{(shape, run): result}: each shape's runs one after the other on one offload."""
    harness, arch = settings["harness"], settings["model"]["architecture"]
    config, device, layers = harness["batched"], harness["device"], harness["restricted_layers"]
    runs = harness["runs"]
    names = {name for _, group in planned for name in group}
    capacities = {name: capacity_of(harness, runs[name]) for name in names}
    recorded = trace.read_futures(trace_path, layers)  # once: every shape cuts its own
    results = {}
    with decode.offloaded(
        model,
        layers,
        max(capacities.values()),
        device,
        ring_mib(harness),
        slots=harness["capacity"] * len(layers),
        link=link.configured(harness),
    ) as off:
        for shape, group in planned:
            cut_sequences = cut(sequences, config["tokens"], shape.prefill)
            futures = futures_of(recorded, cut_sequences)
            base_sums = nll.batched_nll_sums(model, cut_sequences, device)
            for name in group:
                make = batched.policy_factory(
                    runs[name],
                    capacities[name],
                    arch["num_experts"],
                    arch["num_experts_per_tok"],
                    shape.size,
                    # A prefill's union spans the prompt's P tokens of every sequence.
                    shape.size * arch["num_experts_per_tok"] * max(1, shape.prefill),
                )
                arm = off.arm(name, make, capacities[name], block=UnionBlock)
                reads = any(b.policy.needs_future for b in arm.blocks.values())
                results[shape, name] = decode_batched(
                    model,
                    cut_sequences,
                    device,
                    arm,
                    off.own,
                    shape.size,
                    futures if reads else None,
                    settings["seed"],
                    shape.prefill,
                    shape.batching,
                )
                results[shape, name]["base_sums"] = base_sums
    return results


def lossless_failures(name: str, shape: BatchShape, result: dict) -> list[str]:
    """A lossless run's sequences whose NLL left their batch-one NLL (the gates' tolerance)."""
    found = []
    for row, base in zip(result["sequences"], result["base_sums"], strict=True):
        gap = abs(row["nll"] - base / row["scored"])
        if not gap <= gates.POOL_TOLERANCE:
            found.append(
                f"{name} at {shape}: sequence {row['sequence']} NLL {row['nll']:.6f} vs "
                f"batch-one {base / row['scored']:.6f} (|diff| {gap:.2e})"
            )
    return found


def report(settings, shard, name, shape: BatchShape, result: dict, interleaved) -> dict:
    """One run's batched results file, before provenance."""
    spec = settings["harness"]["runs"][name]
    rows = result["sequences"]
    base = sum(result["base_sums"]) / sum(row["scored"] for row in rows)
    totals = dict(result["totals"])
    totals.update(
        base_nll=base,
        delta_nll=totals["nll"] - base,
        **step_intervals(result["batches"], settings["seed"]),
    )
    return {
        "run": name,
        "policy": spec["policy"],
        "params": spec["params"],
        "capacity": capacity_of(settings["harness"], spec),
        "shard": shard,
        "shape": str(shape),
        "lossless": not restricts(settings, name),
        "interleaved_with": sorted(set(interleaved) - {name}),
        "totals": totals,
        "sequences": [
            {**row, "base_nll": b / row["scored"]}
            for row, b in zip(rows, result["base_sums"], strict=True)
        ],
        "batches": result["batches"],
    }


def step_intervals(batch_rows: list[dict], seed: int) -> dict:
    """ms per step and per sequence-token with their 95% intervals, resampling the timed
    steps (a step's seconds, and the sequences it ran): at large B a shard is one batch, so
    batches are too few to resample."""
    seconds = [1e3 * s for row in batch_rows for s in row["step_seconds_each"]]
    running = [n for row in batch_rows for n in row["running_each"]]
    return {
        "steps_timed": len(seconds),
        "ms_per_step": sum(seconds) / len(seconds),
        "ms_per_step_ci": bootstrap_ratio(seconds, [1] * len(seconds), seed),
        "ms_per_sequence_token": sum(seconds) / sum(running),
        "ms_per_sequence_token_ci": bootstrap_ratio(seconds, running, seed),
    }


def restricts(settings: dict, name: str) -> bool:
    from moecache import policies

    return policies.POLICIES[settings["harness"]["runs"][name]["policy"]].restricts


def write(settings, shard, planned, results: dict, out_dir, only=None) -> list[Path]:
    """Every results file, once every lossless run passed its check; `only`: that run's
    alone (fan_out `run`), naming the reference decoded beside it."""
    failed = [
        line
        for (shape, name), result in results.items()
        if not restricts(settings, name)
        for line in lossless_failures(name, shape, result)
    ]
    if failed:
        raise MoecacheError("batched gate failed: " + "; ".join(failed))
    device = settings["harness"]["device"]
    written = []
    for shape, group in planned:
        for name in [only] if only else group:
            path = Path(out_dir) / str(shape) / f"{name}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            body = report(settings, shard, name, shape, results[shape, name], group)
            if only:
                reference = group[0]
                body.update(
                    fan_out="run",
                    reference={"run": reference, "totals": results[shape, reference]["totals"]},
                )
            stamped = provenance.write_results(None, body, settings, device)
            write_record(path, BatchedRunResult(**stamped))
            written.append(path)
    return written


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
    batching="static",
) -> dict:
    """Every sequence under `arm` (built with union_block.UnionBlock), `size` at a time
    with `batching` ("static" or "continuous"), each static batch's first `prefill` tokens
    in one forward; `own`: the model's own blocks, put back afterwards.
    `futures[layer][sequence]`: batch-one demand, for rules that read ahead."""
    batched.check_shape(sequences, size, batching, prefill)
    batched.check_arm(arm, size)
    if any(block.policy.needs_future for block in arm.blocks.values()) and futures is None:
        raise MoecacheError(f"run {arm.name}: reads ahead, and no batch-one demand was given")
    run = continuous.stream if batching == "continuous" else batched.batches
    decode.use(model, arm, own)
    try:
        seq_rows, batch_rows, trace = run(model, sequences, device, arm, (size, prefill), futures)
    finally:
        decode.use(model, decode.Arm("own", {}), own)
    for row in seq_rows:
        row["nll"] = row["nll_sum"] / row["scored"]
    totals = decode_totals.totals(batch_rows, 1, seed)
    if prefill:  # the prefill's copies and seconds, apart from decoding's
        for key in ("prefill_copies", "prefill_rounds", "prefill_seconds"):
            totals[key] = sum(row[key] for row in batch_rows)
    shape = (size, prefill, batching)
    return {
        "sequences": seq_rows,
        "batches": batch_rows,
        "totals": {**totals, "batch": batched.described(shape, trace, arm, batch_rows)},
        "trace": trace,
    }
