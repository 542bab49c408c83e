"""The harness's jobs: exactness gates, one decode run, the layer probe, copy bandwidth.

Each takes the validated settings and writes one JSON results file (and a Parquet trace for
decode runs); the command line only parses arguments and calls these.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from moecache import provenance
from moecache.data import corpus
from moecache.errors import MoecacheError
from moecache.harness import bandwidth, decode, gates, link, link_check, profile, trace
from moecache.model import checkpoint

DEFAULT_RING_MIB = 128


def load(settings: dict, model_source: str, sequences_path):
    harness = settings["harness"]
    torch.set_num_threads(harness["threads"])
    torch.manual_seed(settings["seed"])
    model = load_model(settings, model_source, harness["device"])
    return model, corpus.read_sequences(sequences_path)


def load_model(settings: dict, model_source: str, device: str):
    model_settings = settings["model"]
    return checkpoint.load(
        model_source,
        model_settings["dtype"],
        device,
        model_settings["architecture"],
        model_settings.get("experts_implementation"),
    )


def ring_mib(harness: dict) -> int:
    return harness.get("link_ring_mib", DEFAULT_RING_MIB)


def run_profile(settings, model_source, sequences_path, out) -> dict:
    """One expert copy and one token's compute, measured; held-out NLL and routing reuse."""
    model, sequences = load(settings, model_source, sequences_path)
    harness = settings["harness"]
    device = harness["device"]
    layer = model.model.layers[harness["restricted_layers"][0]]
    copy = bandwidth.measure(
        [layer.mlp.experts],
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
    return provenance.write_results(out, report, settings, device)


def run_gates(settings, model_source, sequences_path, out) -> dict:
    model, sequences = load(settings, model_source, sequences_path)
    sequences = sequences[: settings["harness"].get("gate_sequences")]
    report = gates.run(model, sequences, settings["harness"], settings["seed"])
    gates.check(report)  # a failed gate fails the job, with the numbers, and writes nothing
    return provenance.write_results(out, report, settings, settings["harness"]["device"])


def shard_runs(harness: dict, shard: str, first_shard: str) -> list[tuple[str, int]]:
    """(run, multiplier) pairs decoded on `shard`: every run at 1x on its shards, and at
    its other multipliers on the first shard."""
    pairs = []
    for name, spec in harness["runs"].items():
        if shard in spec.get("shards", [shard]):
            for m in spec.get("multipliers", [1]):
                if m == 1 or shard == first_shard:
                    pairs.append((name, m))
    return pairs


def run_decode(
    settings,
    model_source,
    sequences_path,
    shard,
    first_shard,
    gates_path,
    out_dir,
    *,
    first=None,
    loaded=None,
) -> dict:
    """Every run of `shard` (at its multipliers), interleaved in one process; one results
    file and one trace per run and multiplier in `out_dir`. `first`: decode only the first
    this many sequences; `loaded`: (model, sequences) already in memory."""
    harness = settings["harness"]
    arch = settings["model"]["architecture"]
    pairs = shard_runs(harness, shard, first_shard)
    if not pairs:
        raise MoecacheError(f"shard {shard}: no run of harness.runs decodes it")
    trace_arm = f"{harness['trace_run']}-x1"
    specs, factories = {}, {}
    for name, m in pairs:
        spec = harness["runs"][name]
        capacity = spec.get("capacity", harness["capacity"])
        make = decode.policy_factory(
            spec, capacity, arch["num_experts"], arch["num_experts_per_tok"]
        )
        reads = trace_arm if make().needs_future else None
        if reads and reads not in {f"{n}-x{k}" for n, k in pairs}:
            raise MoecacheError(
                f"run {name}: reads the demand of {harness['trace_run']} at 1x, which shard "
                f"{shard} does not decode"
            )
        specs[f"{name}-x{m}"], factories[f"{name}-x{m}"] = (name, spec, capacity, m, reads), make
    model, sequences = loaded or load(settings, model_source, sequences_path)
    sequences = sequences[:first]
    json.loads(Path(gates_path).read_text())  # the shard's gates passed (the rule's input)
    # Delta NLL against the unmodified model on the sequences each run decoded (the gates
    # showed the batched NLL equal to the teacher-forced one).
    base_sums = decode.batched_nll_sums(model, sequences, harness["device"])
    most = max(capacity for _, _, capacity, _, _ in specs.values())
    layers = harness["restricted_layers"]
    slots = harness["capacity"] * len(layers)
    with decode.offloaded(
        model,
        layers,
        most,
        harness["device"],
        ring_mib(harness),
        slots=slots,
        link=link.configured(harness),
    ) as off:
        # Runs at a multiplier above 1 may decode only the first sequences: slow copies
        # cost most there, and equation (1) is checked on the same sequences at 1x.
        scaled = harness.get("scaled_sequences")
        arms = [
            off.arm(label, factories[label], capacity, m, reads, scaled if m > 1 else None)
            for label, (_, _, capacity, m, reads) in specs.items()
        ]
        memory = off.device_bytes()
        results = decode.decode(
            model,
            sequences,
            harness["device"],
            arms,
            off.own,
            harness["warmup_tokens"],
            harness.get("repeats", 1),
            settings["seed"],
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = harness["device"]
    for label, (name, spec, capacity, m, reads) in specs.items():
        result = results[label]
        totals = result["totals"]
        decoded = [row["sequence"] for row in result["sequences"]]
        base_nll = sum(base_sums[i] for i in decoded) / sum(len(sequences[i]) - 1 for i in decoded)
        totals["delta_nll"] = totals["nll"] - base_nll
        report = {
            "run": name,
            "policy": spec["policy"],
            "params": spec.get("params", {}),
            "capacity": capacity,
            "multiplier": m,
            "shard": shard,
            "restricted_layers": harness["restricted_layers"],
            "base_nll": base_nll,
            "gates": str(gates_path),
            "trace_in": reads,
            "interleaved_with": sorted(set(specs) - {label}),
            "reference_1x": reference_1x(results, name, m, result["sequences"]),
            "device_memory": memory,
            "totals": totals,
            "sequences": result["sequences"],
        }
        origin = {
            "run": name,
            "multiplier": m,
            "settings_hash": provenance.settings_hash(settings),
            "device_name": provenance.device_name(device),
        }
        trace.write(result["trace"], out_dir / f"{label}.parquet", origin)
        provenance.write_results(out_dir / f"{label}.json", report, settings, device)
    return {label: results[label]["totals"] for label in specs}


def reference_1x(results: dict, name: str, multiplier: int, rows: list) -> dict | None:
    """For a run at a multiplier above 1: the same run's 1x totals on the same sequences,
    decoded interleaved with it (what equation (1) predicts from)."""
    one = results.get(f"{name}-x1")
    if multiplier == 1 or one is None:
        return None
    decoded = {row["sequence"] for row in rows}
    return decode.totals([row for row in one["sequences"] if row["sequence"] in decoded])


def run_probe(settings, model_source, sequences_path, gates_path, out) -> dict:
    """Restrict one layer at a time with Dwell-k (window from config); Delta NLL per layer."""
    harness = settings["harness"]
    model, sequences = load(settings, model_source, sequences_path)
    arch = settings["model"]["architecture"]
    window = {key: harness["probe"][key] for key in ("k", "window")}
    spec = {"policy": "dwell", "params": window}
    make = decode.policy_factory(
        spec, harness["capacity"], arch["num_experts"], arch["num_experts_per_tok"]
    )
    base = json.loads(Path(gates_path).read_text())["base"]["nll"]
    # A probe of the first sequences only compares against their own base NLL.
    limit = harness["probe"].get("sequences")
    if limit:
        sequences = sequences[:limit]
        base = decode.batched_nll(model, sequences, harness["device"])
    layers = []
    for layer in range(arch["num_hidden_layers"]):
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
    return provenance.write_results(out, report, settings, harness["device"])


def run_bandwidth(settings, model_source, out) -> dict:
    """Time per expert copy at each configured multiplier, the fixed cost of a group of
    copies, and one large copy of the same bytes."""
    harness = settings["harness"]
    model = load_model(settings, model_source, "cpu")
    experts = [model.model.layers[layer].mlp.experts for layer in harness["restricted_layers"]]
    report = bandwidth.measure(
        experts,
        harness["device"],
        link.multipliers(harness),
        ring_mib(harness),
        capacity=harness["capacity"],
        link=link.configured(harness),
    )
    return provenance.write_results(out, report, settings, harness["device"])


def run_link_check(settings, model_source, sequences_path, out) -> dict:
    """LRU at 1x and at the largest multiplier under each link kind (link_check.py), on the
    first `harness.link_check_sequences` sequences cut to `harness.link_check_tokens`:
    several short ones, so that the shuffled order puts every link in every place."""
    model, sequences = load(settings, model_source, sequences_path)
    harness = settings["harness"]
    tokens = harness.get("link_check_tokens", 96)
    sequences = [ids[:tokens] for ids in sequences[: harness.get("link_check_sequences", 4)]]
    arch = settings["model"]["architecture"]
    report = link_check.run(model, sequences, harness, arch, ring_mib(harness), settings["seed"])
    return provenance.write_results(out, report, settings, harness["device"])
