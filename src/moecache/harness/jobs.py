"""The harness's jobs: exactness gates, one decode run, the layer probe, copy bandwidth.

Each takes the validated settings and writes one JSON results file (and a Parquet trace for
decode runs); the command line only parses arguments and calls these.
"""

from __future__ import annotations

import torch

from moecache import config as configs
from moecache import provenance
from moecache.data import corpus
from moecache.harness import (
    bandwidth,
    batched_runs,
    decode,
    gates,
    link,
    link_check,
    nll,
    placement,
    profile,
    runs,
)
from moecache.model import checkpoint, registry
from moecache.model.memory import HOST, LEDGER, LOAD, host_census, ring_mib
from moecache.records.bandwidth import BandwidthResult, LinkCheckResult
from moecache.records.gates import GatesResult
from moecache.records.io import read_record
from moecache.records.profile import ProbeResult, ProfileResult
from moecache.runs import RunName
from moecache.schedule import accountant


def load(settings: dict, model_source: str, sequences_path):
    harness = settings["harness"]
    torch.set_num_threads(harness["threads"])
    torch.manual_seed(settings["seed"])
    model = load_model(settings, model_source, harness["device"])
    return model, corpus.read_sequences(sequences_path)


def load_model(settings: dict, model_source: str, device: str, offload=True):
    """The model of a job, read into host memory; with `offload` (the harness's jobs) the
    restricted layers' experts stay there, in one pinned copy, and only the other weights
    go to the device (harness/placement.py); without (training through the experts), the
    whole model goes to the device."""
    model_settings = settings["model"]
    LEDGER.reset()  # a job's peaks start at its model
    # What transformers holds while it reads (no Ledger call sees it): the load phase's.
    with host_census() as counted:
        model = checkpoint.load(
            model_source,
            model_settings["dtype"],
            "cpu" if offload else device,
            model_settings["architecture"],
            model_settings.get("experts_implementation"),
            configs.family(settings),
            stored_layers=settings["harness"]["restricted_layers"],
        )
        if offload:
            placement.place(model, settings["harness"]["restricted_layers"], device)
    LEDGER.record(LOAD, HOST, counted["peak"])
    return model


def run_profile(settings, model_source, sequences_path, out) -> dict:
    """One expert copy and one token's compute, measured; held-out NLL and routing reuse."""
    model, sequences = load(settings, model_source, sequences_path)
    harness = settings["harness"]
    device = harness["device"]
    adapter = registry.of(model)
    copy = bandwidth.measure(
        [adapter.layer_experts(model, harness["restricted_layers"][0])],
        device,
        [1],
        ring_mib(harness),
        capacity=harness["capacity"],
        link=link.configured(harness),
    )
    token_s = profile.token_seconds(model, sequences[: harness.get("gate_sequences")], device)
    report = {
        "device": device,
        "expert_bytes": copy["expert_bytes"],
        "expert_copy_ms": copy["tau_ms"],
        "token_compute_ms": 1e3 * sum(token_s) / len(token_s),
        "timed_tokens": len(token_s),
        **profile.routing(model, sequences, device, settings["seed"]),
    }
    report["copy_share_of_token"] = report["expert_copy_ms"] / report["token_compute_ms"]
    return provenance.write_results(out, report, settings, device, kind=ProfileResult)


def run_gates(settings, model_source, sequences_path, out) -> dict:
    model, sequences = load(settings, model_source, sequences_path)
    sequences = sequences[: settings["harness"].get("gate_sequences")]
    left_out = accountant.reference_left_out(settings)
    if left_out is None:
        longest = max(len(ids) for ids in sequences)
        reference = {"all": runs.resident_spec(settings)}
        runs.refuse_unfitting_reference(settings, reference, model, longest)
    LEDGER.begin("gates")
    report = gates.run(model, sequences, settings["harness"], settings["seed"], left_out)
    report["accountant"] = LEDGER.report()
    gates.check(report)  # a failed gate fails the job, with the numbers, and writes nothing
    device = settings["harness"]["device"]
    return provenance.write_results(out, report, settings, device, kind=GatesResult)


def run_decode(
    settings,
    model_source,
    sequences_path,
    shard,
    first_shard,
    gates_path,
    out_dir,
    *,
    run: RunName | None = None,
    trace_dir=None,
    first=None,
    loaded=None,
) -> dict:
    """Every run of `shard` (at its multipliers) interleaved in one process, or with `run`
    that run at its multiplier beside its reference (harness.fan_out, runs.py); one
    results file in `out_dir` and one trace in `trace_dir` (default `out_dir`) per run
    and multiplier written. `first`: decode only the first this many sequences;
    `loaded`: (model, sequences) already in memory."""
    if run is None:  # a bad run refuses before loading
        planned = runs.runs_for_shard(settings, shard, first_shard)
    else:
        planned = runs.runs_for_run(settings, shard, first_shard, run.run, run.multiplier)
    model, sequences = loaded or load(settings, model_source, sequences_path)
    sequences = sequences[:first]
    if loaded is None:  # what the run holds, from the model's config, before it decodes
        longest = max(len(ids) for ids in sequences)
        memory = accountant.account(
            settings, source=model_source, tokens=longest, shard=first_shard
        )
        print("\n".join(accountant.lines(memory)))
    read_record(gates_path, GatesResult)  # the shard's gates passed (the rule's input)
    LEDGER.begin("decode")
    decoded = runs.decode_runs(settings, model, sequences, planned)
    only = None if run is None else str(run)
    runs.write(settings, planned, decoded, shard, gates_path, out_dir, trace_dir, only)
    written = [only] if only else list(planned)
    return {label: decoded.results[label]["totals"] for label in written}


def run_decode_batched(
    settings,
    model_source,
    sequences_path,
    where: dict,
    size: int,
    run=None,
    shape=None,
    loaded=None,
) -> list:
    """harness.batched's runs at batch size `size` (every shape), or `run` at `shape` beside
    the all-resident reference (batched_runs.py); `where`: shard, gates, trace, out_dir;
    `loaded`: (model, sequences) already in memory. The written files."""
    planned = batched_runs.to_decode(settings, size, run, shape)  # refuses before loading
    model, sequences = loaded or load(settings, model_source, sequences_path)
    sequences = sequences[: settings["harness"]["batched"]["sequences"]]
    if loaded is None:  # what the run holds, from the model's config, before it decodes
        longest = max(len(ids) for ids in sequences)
        # The decode and gates jobs' peaks are not this job's: the sizes alone.
        memory = accountant.account(settings, source=model_source, tokens=longest, reference=False)
        print("\n".join(accountant.lines(memory)))
    read_record(where["gates"], GatesResult)  # the shard's gates passed (the rule's input)
    results = batched_runs.decode_shapes(settings, model, sequences, where["trace"], planned)
    return batched_runs.write(settings, where["shard"], planned, results, where["out_dir"], run)


def run_probe(settings, model_source, sequences_path, gates_path, out) -> dict:
    """Restrict one layer at a time with Dwell-k (window from config); Delta NLL per layer."""
    harness = settings["harness"]
    model, sequences = load(settings, model_source, sequences_path)
    arch = settings["model"]["architecture"]
    window = {key: harness["probe"][key] for key in ("k", "window")}
    spec = configs.run_spec("dwell", window)
    make = decode.policy_factory(
        spec, harness["capacity"], arch["num_experts"], arch["num_experts_per_tok"]
    )
    base = read_record(gates_path, GatesResult).base["nll"]
    # A probe of the first sequences only compares against their own base NLL.
    limit = harness["probe"].get("sequences")
    if limit:
        sequences = sequences[:limit]
        base = nll.batched_nll(model, sequences, harness["device"])
    layers = []
    sparse = registry.of(model).sizes(model.config).moe_layers  # dense layers have no experts
    for layer in sparse:
        with decode.offloaded(model, [layer], harness["capacity"], harness["device"], 1) as off:
            arm = off.arm(f"layer {layer}", make, harness["capacity"])
            totals = decode.decode(
                model, sequences, harness["device"], [arm], off.own, harness["warmup_tokens"]
            )[arm.name]["totals"]
        layers.append(
            {
                "layer": layer,
                "nll": totals["nll"],
                "delta_nll": totals["nll"] - base,
                "rho": totals["rho"],
            }
        )
    report = {
        "probe": spec,
        "base_nll": base,
        "layers": layers,
    }
    return provenance.write_results(out, report, settings, harness["device"], kind=ProbeResult)


def run_bandwidth(settings, model_source, out) -> dict:
    """Time per expert copy at each configured multiplier, the fixed cost of a group of
    copies, and one large copy of the same bytes."""
    harness = settings["harness"]
    model = load_model(settings, model_source, "cpu")
    adapter = registry.of(model)
    experts = [adapter.layer_experts(model, layer) for layer in harness["restricted_layers"]]
    report = bandwidth.measure(
        experts,
        harness["device"],
        link.multipliers(harness),
        ring_mib(harness),
        capacity=harness["capacity"],
        link=link.configured(harness),
    )
    device = harness["device"]
    return provenance.write_results(out, report, settings, device, kind=BandwidthResult)


def run_link_check(settings, model_source, sequences_path, out) -> dict:
    """LRU at 1x and at the largest multiplier under each link kind (link_check.py), on the
    first `harness.link_check_sequences` sequences cut to `harness.link_check_tokens`:
    several short ones, so that the shuffled order puts every link in every place."""
    model, sequences = load(settings, model_source, sequences_path)
    harness = settings["harness"]
    tokens = harness["link_check_tokens"]
    sequences = [ids[:tokens] for ids in sequences[: harness["link_check_sequences"]]]
    arch = settings["model"]["architecture"]
    ring = ring_mib(harness)
    report = link_check.run(model, sequences, harness, arch, ring, settings["seed"])
    device = harness["device"]
    return provenance.write_results(out, report, settings, device, kind=LinkCheckResult)
