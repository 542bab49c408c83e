"""The harness's jobs: exactness gates, one decode run, the layer probe, copy bandwidth.

Each takes the validated settings and writes one JSON results file (and a Parquet trace for
decode runs); the command line only parses arguments and calls these.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

from moecache import provenance
from moecache.data import corpus
from moecache.errors import MoecacheError
from moecache.harness import decode, gates, profile, trace
from moecache.harness.pool import ExpertPool
from moecache.harness.timing import Stopwatch
from moecache.model import checkpoint
from moecache.policies import Plan


def load(settings: dict, model_source: str, sequences_path):
    harness, model_settings = settings["harness"], settings["model"]
    torch.set_num_threads(harness["threads"])
    torch.manual_seed(settings["seed"])
    model = checkpoint.load(
        model_source, model_settings["dtype"], harness["device"], model_settings["architecture"]
    )
    return model, corpus.read_sequences(sequences_path)


def run_profile(settings, model_source, sequences_path, out) -> dict:
    """One expert copy and one token's compute, measured; held-out NLL and routing reuse."""
    model, sequences = load(settings, model_source, sequences_path)
    device = settings["harness"]["device"]
    layer = model.model.layers[settings["harness"]["restricted_layers"][0]]
    nbytes, copy_s = profile.expert_copy_seconds(
        layer.mlp.experts, device, repeats=10 * model.config.num_experts
    )
    token_s = profile.token_seconds(model, sequences, device)
    report = {
        "device": device,
        "expert_bytes": nbytes,
        "expert_copy_ms": copy_s * 1e3,
        "token_compute_ms": 1e3 * sum(token_s) / len(token_s),
        "timed_tokens": len(token_s),
        **profile.routing(model, sequences, device, settings["seed"]),
    }
    report["copy_share_of_token"] = report["expert_copy_ms"] / report["token_compute_ms"]
    return provenance.write_results(out, report, settings, device)


def run_gates(settings, model_source, sequences_path, out) -> dict:
    model, sequences = load(settings, model_source, sequences_path)
    harness = settings["harness"]
    report = gates.run(model, sequences, harness, harness["warmup_tokens"])
    gates.check(report)  # a failed gate fails the job, with the numbers, and writes nothing
    return provenance.write_results(out, report, settings, harness["device"])


def run_decode(
    settings,
    model_source,
    sequences_path,
    run_name,
    multiplier,
    gates_path,
    out,
    trace_out,
    trace_in=None,
) -> dict:
    harness = settings["harness"]
    if run_name not in harness["runs"]:
        raise MoecacheError(f"run {run_name!r}: not in harness.runs")
    if multiplier < 1:
        raise MoecacheError(f"--multiplier: {multiplier} must be at least 1")
    spec = harness["runs"][run_name]
    arch = settings["model"]["architecture"]
    capacity = spec.get("capacity", harness["capacity"])
    make = decode.policy_factory(spec, capacity, arch["num_experts"], arch["num_experts_per_tok"])
    futures = None
    if make().needs_future:  # checked before the model loads: bad input fails fast
        if trace_in is None:
            raise MoecacheError(f"run {run_name}: policy {spec['policy']} needs --trace-in")
        futures = trace.read_futures(trace_in, harness["restricted_layers"])
    model, sequences = load(settings, model_source, sequences_path)
    base = json.loads(Path(gates_path).read_text())
    with decode.pooled(
        model, harness["restricted_layers"], capacity, harness["device"], multiplier, make
    ) as blocks:
        result = decode.decode(
            model,
            sequences,
            harness["device"],
            blocks,
            futures,
            harness["warmup_tokens"],
            label=run_name,
        )
    totals = result["totals"]
    totals["delta_nll"] = totals["nll"] - base["base"]["nll"]
    report = {
        "run": run_name,
        "policy": spec["policy"],
        "params": spec.get("params", {}),
        "capacity": capacity,
        "multiplier": multiplier,
        "restricted_layers": harness["restricted_layers"],
        "base_nll": base["base"]["nll"],
        "gates": str(gates_path),
        "trace_in": str(trace_in) if trace_in else None,
        "totals": totals,
        "sequences": result["sequences"],
    }
    origin = {
        "run": run_name,
        "multiplier": multiplier,
        "settings_hash": provenance.settings_hash(settings),
        "device_name": provenance.device_name(harness["device"]),
    }
    trace.write(result["trace"], trace_out, origin)
    return provenance.write_results(out, report, settings, harness["device"])


def run_probe(settings, model_source, sequences_path, gates_path, out) -> dict:
    """Restrict one layer at a time with Dwell-k (window from config); Delta NLL per layer."""
    harness = settings["harness"]
    model, sequences = load(settings, model_source, sequences_path)
    arch = settings["model"]["architecture"]
    spec = {"policy": "dwell", "params": dict(harness["probe"])}
    make = decode.policy_factory(
        spec, harness["capacity"], arch["num_experts"], arch["num_experts_per_tok"]
    )
    base = json.loads(Path(gates_path).read_text())["base"]["nll"]
    layers = []
    for layer in range(arch["num_hidden_layers"]):
        with decode.pooled(
            model, [layer], harness["capacity"], harness["device"], 1, make
        ) as blocks:
            totals = decode.decode(
                model,
                sequences,
                harness["device"],
                blocks,
                warmup_tokens=harness["warmup_tokens"],
                label=f"layer {layer}",
            )["totals"]
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
    return provenance.write_results(out, report, settings, harness["device"])


def run_bandwidth(settings, model_source, out, repeats: int = 5) -> dict:
    """tau and GiB/s of the per-expert copy loop, and of one large copy of the same bytes."""
    harness = settings["harness"]
    model = checkpoint.load(
        model_source, settings["model"]["dtype"], "cpu", settings["model"]["architecture"]
    )
    experts = model.model.layers[harness["restricted_layers"][0]].mlp.experts
    device = harness["device"]
    n = experts.gate_up_proj.shape[0]
    pool = ExpertPool(experts, n, device)
    nbytes = n * pool.expert_bytes
    flat_host = torch.empty(nbytes, dtype=torch.uint8)
    if pool.non_blocking:
        flat_host = flat_host.pin_memory()
    flat_device = torch.empty(nbytes, dtype=torch.uint8, device=device)
    watch = Stopwatch(device)
    loop, large = [], []
    for _ in range(repeats):
        pool.reset()
        pool.clear_counts()
        watch.start()
        pool.apply(Plan(admit=list(range(n))))
        loop.append(watch.stop())
        watch.start()
        flat_device.copy_(flat_host, non_blocking=pool.non_blocking)
        large.append(watch.stop())
    loop_s, large_s = statistics.median(loop), statistics.median(large)
    gib = nbytes / 2**30
    report = {
        "experts": n,
        "expert_bytes": pool.expert_bytes,
        "bytes": nbytes,
        "tau_ms": 1e3 * loop_s / n,
        "loop_gib_per_s": gib / loop_s,
        "large_copy_ms": 1e3 * large_s,
        "large_gib_per_s": gib / large_s,
    }
    return provenance.write_results(out, report, settings, device)
