"""The harness's jobs: exactness gates, one decode run, the layer probe, copy bandwidth.

Each takes the validated settings and writes one JSON results file (and a Parquet trace for
decode runs); the command line only parses arguments and calls these.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from moecache import config as configs
from moecache import provenance
from moecache.data import corpus
from moecache.errors import MoecacheError
from moecache.harness import bandwidth, decode, gates, link, link_check, profile, trace
from moecache.model import checkpoint, plan, registry

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
        configs.family(settings),
    )


def ring_mib(harness: dict) -> int:
    return harness.get("link_ring_mib", DEFAULT_RING_MIB)


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
    if loaded is None:  # what the run holds, from the model's config, before it decodes
        longest = max(len(ids) for ids in sequences)
        print("\n".join(plan.lines(plan.plan(settings, source=model_source, tokens=longest))))
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
        one = {label: spec for label, spec in specs.items() if spec[3] == 1}
        arms = [
            off.arm(label, factories[label], capacity, 1, reads)
            for label, (_, _, capacity, _, reads) in one.items()
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
        demand = {arm.name: arm.demand for arm in arms}
        # Runs at a multiplier above 1 decode the first sequences token by token beside a
        # 1x twin of themselves, each on slots of its own: drift on this machine's second
        # scales falls on the twin and the slower links alike, and equation (1) predicts
        # them from the twin. Slow copies cost most here, hence the fewer sequences.
        twins = {}
        for name in dict.fromkeys(spec[0] for spec in specs.values() if spec[3] > 1):
            group = [(f"{name}-twin-x1", 1)] + [
                (label, spec[3]) for label, spec in specs.items() if spec[0] == name and spec[3] > 1
            ]
            first = group[1][0]  # every label of the group decodes one spec
            _, _, capacity, _, reads = specs[first]
            make = factories[first]
            twin = decode.decode(
                model,
                sequences[: harness.get("scaled_sequences")],
                harness["device"],
                [off.arm(label, make, capacity, m, reads, own_slots=True) for label, m in group],
                off.own,
                harness["warmup_tokens"],
                harness.get("repeats", 1),
                settings["seed"],
                lockstep=True,
                demand=demand,
            )
            twins[name] = twin.pop(group[0][0])
            results.update(twin)
    for label, (name, _, _, m, _) in specs.items():
        if m > 1:
            same_counts(label, results[label], twins[name], results.get(f"{name}-x1"))
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
            "interleaved_with": interleaved_with(specs, label),
            "twin_1x": None if m == 1 else twin_record(twins[name]),
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


def interleaved_with(specs: dict, label: str) -> list[str]:
    """The arms decoded beside `label`: the other 1x runs, or its twin and its other
    multipliers."""
    name, m = specs[label][0], specs[label][3]
    if m == 1:
        return sorted(k for k, spec in specs.items() if spec[3] == 1 and k != label)
    scaled = {k for k, spec in specs.items() if spec[0] == name and spec[3] > 1}
    return sorted({f"{name}-twin-x1"} | scaled - {label})


def twin_record(twin: dict) -> dict:
    """What the results file keeps of a scaled run's 1x twin: its totals and per-sequence
    timing (equation (1)'s reference)."""
    keys = ("sequence", "timed_tokens", "step_seconds", "copy_seconds", "timed_copies")
    rows = [{key: row[key] for key in keys} for row in twin["sequences"]]
    return {"totals": twin["totals"], "sequences": rows}


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
    return provenance.write_results(out, report, settings, harness["device"])


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
