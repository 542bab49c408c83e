"""The decode job in three steps: pick the runs, decode interleaved, write one results file
and one trace per run and multiplier (jobs.run_decode calls them in turn).

harness.fan_out picks the runs: `shard` (runs_for_shard) decodes every run of a shard in one
job; `run` (runs_for_run) decodes one run at one multiplier, beside the reference it is
compared with on the same device: the all-resident run for a 1x run, its 1x twin for a
scaled run (decode_scaled adds that), and the trace run when it reads that run's demand."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from moecache import config as configs
from moecache import provenance
from moecache.errors import MoecacheError
from moecache.harness import decode, gates, link, nll, overlap
from moecache.harness.overlapped_block import overlapped, refuse_unranked
from moecache.model.memory import LEDGER, device_total_bytes, ring_mib
from moecache.records import trace as traces
from moecache.records.io import write_run
from moecache.records.run import RunResult, SequenceRow
from moecache.runs import RunName
from moecache.schedule.accountant import reference_device_bytes, reference_left_out
from moecache.schedule.runs import (
    RESIDENT,
    capacity_of,
    kept_runs,
    scaled_groups,
    shard_runs,
    slot_layout,
)


@dataclass(frozen=True)
class RunSpec:
    """One run of harness.runs at one of its multipliers, as a shard decodes it."""

    name: str  # its key in harness.runs
    spec: dict  # its entry there: policy, params, ...
    capacity: int  # device slots per restricted layer
    multiplier: int  # the slower link's factor (1: the machine's own)
    reads: str | None  # the label whose demand it reads (farthest-future), else None
    make: Callable[[], object]  # a fresh policy
    limit: int | None = None  # decodes only the first this many sequences (None: all)
    block: Callable[[], object] | None = None  # an overlapped run's blocks (None: blocking)

    @property
    def label(self) -> str:
        return str(RunName(self.name, self.multiplier))


class Decoded(NamedTuple):
    """What the decoding step measured, for the writing step."""

    results: dict  # label -> decode.decode's result, totals with delta_nll
    base_nll: dict  # label -> the unmodified model's NLL on the sequences it decoded
    twins: dict  # run name -> its 1x twin's result (runs at a multiplier above 1)
    memory: dict  # what the device held while pooled (Offload.device_bytes)


def runs_for_shard(settings: dict, shard: str, first_shard: str) -> dict[str, RunSpec]:
    """The runs `shard` decodes, by label, in harness.runs's order; a bad policy or a
    demand read from a run the shard does not decode refuses with one line."""
    harness = settings["harness"]
    pairs = shard_runs(settings, shard, first_shard)
    left_out = reference_left_out(settings)
    if left_out:
        print(left_out, file=sys.stderr)
    pairs = kept_runs(harness, pairs, not left_out)
    if not pairs:
        raise MoecacheError(f"shard {shard}: no run of harness.runs decodes it")
    labels = {str(RunName(n, k)) for n, k in pairs}
    runs = {}
    for name, m in pairs:
        run = run_spec(settings, name, harness["runs"][name], m)
        if run.reads and run.reads not in labels:
            raise MoecacheError(
                f"run {name}: reads the demand of {harness['trace_run']} at 1x, which shard "
                f"{shard} does not decode"
            )
        runs[run.label] = run
    return runs


def runs_for_run(
    settings: dict, shard: str, first_shard: str, name: str, multiplier: int
) -> dict[str, RunSpec]:
    """harness.fan_out `run`: run `name` at `multiplier` (last, the label the job writes)
    beside what it needs on its own device: the trace run at 1x when it reads that run's
    demand (on the sequences it decodes), and the all-resident reference for a 1x run."""
    harness = settings["harness"]
    if (name, multiplier) not in shard_runs(settings, shard, first_shard):
        raise MoecacheError(
            f"run {name} at {multiplier}x: not decoded on shard {shard} (harness.runs)"
        )
    target = run_spec(settings, name, harness["runs"][name], multiplier)
    runs = {}
    if target.reads:
        trace_run = harness["trace_run"]
        limit = None if multiplier == 1 else harness.get("scaled_sequences")
        source = run_spec(settings, trace_run, harness["runs"][trace_run], 1, limit)
        runs[source.label] = source
    kept = not reference_left_out(settings)
    if multiplier == 1 and target.spec["policy"] != RESIDENT and kept:
        reference = resident_spec(settings)
        runs[reference.label] = reference
    runs[target.label] = target
    return runs


def resident_spec(settings: dict) -> RunSpec:
    """The all-resident reference: the config's first all-resident run, else one of its
    own (named all-resident) with every expert on the device."""
    runs = settings["harness"]["runs"]
    name = next((n for n, spec in runs.items() if spec["policy"] == RESIDENT), None)
    if name is None:
        num_experts = settings["model"]["architecture"]["num_experts"]
        spec = configs.run_spec(RESIDENT, capacity=num_experts)
        return run_spec(settings, "all-resident", spec, 1)
    return run_spec(settings, name, runs[name], 1)


def run_spec(settings: dict, name: str, spec: dict, multiplier: int, limit=None) -> RunSpec:
    """One run at one multiplier; a bad policy or prefetcher refuses with one line."""
    harness, arch = settings["harness"], settings["model"]["architecture"]
    capacity = capacity_of(harness, spec)
    make = decode.policy_factory(spec, capacity, arch["num_experts"], arch["num_experts_per_tok"])
    block, policy = overlapped_blocks(spec), make()
    if block is not None:  # refused now, before the model loads
        refuse_unranked(spec["prefetch"], policy)
    traced = policy.needs_future or (block is not None and block().prefetcher.needs_trace)
    reads = str(RunName(harness["trace_run"])) if traced else None
    if block is not None and limit is None:
        # At 1x an overlapped run decodes the sequences the scaled runs decode, where the
        # overlap cost model compares it with the blocking runs at every multiplier.
        limit = harness.get("scaled_sequences")
    return RunSpec(name, spec, capacity, multiplier, reads, make, limit, block)


def overlapped_blocks(spec: dict):
    """An overlapped run's (`overlap: true`) factory of its arm's blocks: asynchronous
    copies and its prefetcher (harness/overlapped_block.py); None for a blocking run."""
    if not spec["overlap"]:
        return None
    prefetch, params = spec["prefetch"], spec["prefetch_params"]
    overlapped(prefetch, **params)  # fails now, with one line, on a bad name or parameter
    return lambda: overlapped(prefetch, **params)


def block_of(run: RunSpec) -> dict:
    """Offload.arm's `block` keyword for `run` (none: the blocking pooled block)."""
    return {} if run.block is None else {"block": run.block()}


def decode_runs(settings: dict, model, sequences, runs: dict[str, RunSpec]) -> Decoded:
    """The 1x runs interleaved sequence by sequence, then each scaled run's group beside
    its twin; Delta NLL against the unmodified model on the sequences each run decoded
    (the gates showed the batched NLL equal to the teacher-forced one)."""
    harness = settings["harness"]
    longest = max(len(ids) for ids in sequences)
    refuse_unfitting_reference(settings, runs, model, longest)
    # The model's own blocks, their experts staged one layer at a time where the device is
    # not the host (harness/placement.py), before any slot is held.
    base_sums = nll.batched_nll_sums(model, sequences, harness["device"])
    cut = scaled_sequences(harness, sequences)
    cut_sums = nll.batched_nll_sums(model, cut, harness["device"]) if scaled_groups(runs) else []
    layers = harness["restricted_layers"]
    with decode.offloaded(
        model,
        layers,
        slot_layout(runs)[0],
        harness["device"],
        ring_mib(harness),
        slots=harness["capacity"] * len(layers),
        link=link.configured(harness),
    ) as off:
        arms = [
            off.arm(label, run.make, run.capacity, 1, run.reads, run.limit, **block_of(run))
            for label, run in runs.items()
            if run.multiplier == 1
        ]
        memory = off.device_bytes()
        results = {}
        if arms:  # a scaled run that reads no demand decodes only beside its twin
            results = decode.decode(
                model, sequences, harness["device"], arms, off.own, *pace(settings)
            )
        demand = {arm.name: arm.demand for arm in arms}
        del arms
        off.release_slots()  # the scaled groups decode on slots of their own
        twins = {}
        for name, group in scaled_groups(runs).items():
            scaled = decode_scaled(settings, model, sequences, off, group, demand)
            twins[name] = scaled.pop(str(RunName(name).twin))
            results.update(scaled)
    # The 1x run decoded the scaled runs' sequences whole: it is compared only when they are.
    whole = harness.get("scaled_tokens") is None
    for label, run in runs.items():
        if run.multiplier > 1:
            one = results.get(str(RunName(run.name))) if whole else None
            same_counts(label, results[label], twins[run.name], one)
    base_nll = {}
    for label, run in runs.items():
        result = results[label]
        texts, sums = (cut, cut_sums) if run.multiplier > 1 else (sequences, base_sums)
        decoded = [row["sequence"] for row in result["sequences"]]
        base_nll[label] = sum(sums[i] for i in decoded) / sum(len(texts[i]) - 1 for i in decoded)
        result["totals"]["delta_nll"] = result["totals"]["nll"] - base_nll[label]
    refuse_lossy_lossless(runs, results)
    return Decoded(results, base_nll, twins, memory)


def refuse_unfitting_reference(settings: dict, runs: dict[str, RunSpec], model, tokens) -> None:
    """An all-resident run that the device cannot hold fails the job before any slot is
    allocated, in one line saying how to leave it out (`model`'s folder planned for
    sequences of `tokens`)."""
    if not any(run.spec["policy"] == RESIDENT for run in runs.values()):
        return
    device = settings["harness"]["device"]
    need = reference_device_bytes(settings, model.config, tokens)
    have = device_total_bytes(device)
    if need > have:
        raise MoecacheError(
            f"the all-resident reference needs {need / 2**30:.1f} GiB on {device}, which has "
            f"{have / 2**30:.1f} GiB: set harness.device_gib to leave it out"
        )


def refuse_lossy_lossless(runs: dict[str, RunSpec], results: dict) -> None:
    """A lossless run (blocking or overlapped, prefetching or not) whose NLL left the base
    NLL by more than the gates' tolerance fails the job, with its numbers."""
    for label, run in runs.items():
        gap = abs(results[label]["totals"]["delta_nll"])
        if not run.make().restricts and not gap <= gates.POOL_TOLERANCE:
            raise MoecacheError(
                f"run {label}: lossless, but its NLL left the base NLL by {gap:.2e} "
                f"(the gates' tolerance {gates.POOL_TOLERANCE:.0e})"
            )


def pace(settings: dict) -> tuple[int, int, int]:
    """decode.decode's warm-up tokens, repeats and seed."""
    harness = settings["harness"]
    return harness["warmup_tokens"], harness["repeats"], settings["seed"]


def decode_scaled(settings, model, sequences, off, group: list[RunSpec], demand) -> dict:
    """Runs at a multiplier above 1 decode the first sequences token by token beside a
    1x twin of themselves, each on slots of its own: drift on this machine's second
    scales falls on the twin and the slower links alike, and equation (1) predicts
    them from the twin. Slow copies cost most here, hence the fewer sequences."""
    harness = settings["harness"]
    run = group[0]  # every run of the group decodes one spec
    labels = [(str(RunName(run.name).twin), 1)] + [(r.label, r.multiplier) for r in group]
    arms = [
        off.arm(label, run.make, run.capacity, m, run.reads, own_slots=True, **block_of(run))
        for label, m in labels
    ]
    cut = scaled_sequences(harness, sequences)
    demand = {name: cut_demand(rows, cut) for name, rows in demand.items()}
    results = decode.decode(
        model, cut, harness["device"], arms, off.own, *pace(settings), lockstep=True, demand=demand
    )
    del arms
    gc.collect()  # this group's slots given back before the next group's are made
    return results


def scaled_sequences(harness: dict, sequences: list) -> list:
    """What runs at a multiplier above 1 decode: the first `scaled_sequences`, each cut to
    its first `scaled_tokens` tokens (default: all of them, whole)."""
    tokens = harness.get("scaled_tokens")
    return [ids[:tokens] for ids in sequences[: harness.get("scaled_sequences")]]


def cut_demand(by_sequence: dict, cut: list) -> dict:
    """A recorded demand cut as the sequences were: a policy reading the future of a cut
    sequence sees it end where the sequence now ends."""
    return {
        seq: {layer: requested[: len(cut[seq])] for layer, requested in layers.items()}
        for seq, layers in by_sequence.items()
        if seq < len(cut)
    }


def same_counts(label: str, scaled: dict, twin: dict, one: dict | None) -> None:
    """A slower link changes no decision: the scaled run, its twin and (on the sequences
    both decoded) the run at 1x made the same copies."""
    counts = ("timed_copies", "fills", "steady")
    for seq, (a, b) in enumerate(zip(scaled["sequences"], twin["sequences"], strict=True)):
        c = one["sequences"][seq] if one else b
        if any(not a[key] == b[key] == c[key] for key in counts):
            raise MoecacheError(
                f"run {label}: sequence {seq} made other copies than its 1x twin or 1x run "
                f"({', '.join(f'{k} {a[k]}/{b[k]}/{c[k]}' for k in counts)})"
            )


def write(settings, runs, decoded: Decoded, shard, gates_path, out_dir, trace_dir=None, only=None):
    """One results file in `out_dir` and one Parquet trace in `trace_dir` (default
    `out_dir`) per label; `only`: that label's alone (fan_out `run`: the others were its
    references), its results file naming the reference it was decoded beside."""
    out_dir, trace_dir = Path(out_dir), Path(trace_dir or out_dir)
    for folder in (out_dir, trace_dir):
        folder.mkdir(parents=True, exist_ok=True)
    for label in [only] if only else runs:
        run = runs[label]
        result = results_report(settings, runs, decoded, label, shard, gates_path)
        if only:
            reference = reference_record(runs, decoded, label)
            result = replace(result, fan_out="run", reference=reference)
        origin = {
            "run": run.name,
            "multiplier": run.multiplier,
            "settings_hash": result.settings_hash,
            "device_name": result.device_name,
        }
        traces.write(decoded.results[label]["trace"], trace_dir / f"{label}.parquet", origin)
        write_run(out_dir / f"{label}.json", result)


def results_report(settings, runs, decoded: Decoded, label, shard, gates_path) -> RunResult:
    """A run's results record, its provenance stamped (settings, versions, device)."""
    run = runs[label]
    result = decoded.results[label]
    overlapped = run.spec["overlap"]
    rows = tuple(SequenceRow.decoded(row) for row in result["sequences"])
    return RunResult(
        run=run.name,
        policy=run.spec["policy"],
        params=run.spec["params"],
        overlap=overlapped,
        restricts=run.make().restricts,
        prefetch=run.spec["prefetch"] if overlapped else None,
        prefetch_params=run.spec["prefetch_params"],
        capacity=run.capacity,
        multiplier=run.multiplier,
        shard=shard,
        restricted_layers=settings["harness"]["restricted_layers"],
        base_nll=decoded.base_nll[label],
        gates=str(gates_path),
        trace_in=run.reads,
        interleaved_with=interleaved_with(runs, label),
        twin_1x=None if run.multiplier == 1 else twin_record(decoded.twins[run.name]),
        device_memory=decoded.memory,
        accountant=LEDGER.report(),
        sequences_decoded=[row.sequence for row in rows],
        totals=result["totals"],
        sequences=rows,
        **provenance.stamp(settings, settings["harness"]["device"]),
    )


def reference_record(runs: dict[str, RunSpec], decoded: Decoded, label: str) -> dict | None:
    """A 1x run's all-resident reference, decoded beside it on the same device (fan_out
    `run`): its label, totals and per-sequence timing; None for a scaled run (its
    reference is twin_1x) or the all-resident run itself."""
    found = [
        other
        for other, run in runs.items()
        if other != label and run.spec["policy"] == RESIDENT and run.multiplier == 1
    ]
    if runs[label].multiplier != 1 or not found:
        return None
    return {"run": found[0], **twin_record(decoded.results[found[0]])}


def interleaved_with(runs: dict[str, RunSpec], label: str) -> list[str]:
    """The arms decoded beside `label`: the other 1x runs, or its twin and its other
    multipliers."""
    name, m = runs[label].name, runs[label].multiplier
    if m == 1:
        return sorted(k for k, run in runs.items() if run.multiplier == 1 and k != label)
    scaled = {k for k, run in runs.items() if run.name == name and run.multiplier > 1}
    return sorted({str(RunName(name).twin)} | scaled - {label})


def twin_record(twin: dict) -> dict:
    """What the results file keeps of a scaled run's 1x twin: its totals and per-sequence
    timing (equation (1)'s reference)."""
    keys = ("sequence", "timed_tokens", "step_seconds", "copy_seconds", "timed_copies")
    keys += (*overlap.SUMMED, overlap.GROUPS)  # an overlapped twin's counts (the cost model's)
    rows = [{key: row[key] for key in keys if key in row} for row in twin["sequences"]]
    return {"totals": twin["totals"], "sequences": rows}
