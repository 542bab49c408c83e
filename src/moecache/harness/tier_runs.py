"""The tiers measured for real (issue 40, point 3; docs/tiers.md, "Measured in the harness").

The restricted layers' experts go to a safetensors file on disk; arms decode the first few
held-out sequences token by token with the KV cache, each sequence `repeats` times in a
shuffled order of arms: the all-resident reference (every expert in a device slot, nothing
moves: its ms/token is equation (1)'s c) and one tiered arm per admission (C device slots
over a host cache of H experts over the disk, tier_block.py). First the prices of one
event are measured apart from any decode (`prices`): a disk read of an expert into the host
cache, a copy into a device slot, a token's matvec from a host slot and from a device slot.
Equation (1) with a term per tier (costs/equation.py) then predicts each tiered arm's
ms/token from c, its counts and those prices; the record keeps both.
"""

from __future__ import annotations

import random
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from moecache.costs import equation
from moecache.errors import MoecacheError
from moecache.harness import placement
from moecache.harness.disk_pool import DiskExperts, HostCache, write_experts
from moecache.harness.host_compute import Clock, host_matvec, kernel_over
from moecache.harness.pool import HostExperts
from moecache.harness.tier_block import EVENTS, TIMES, TieredMoeBlock
from moecache.harness.tier_schedule import DeviceTier, HostTier, LayerTiers, causal_rule
from moecache.intervals import bootstrap_ratio
from moecache.model import registry
from moecache.model.kernel import expert

RESIDENT = "all-resident"
WARMUP_TOKENS = 8
PRICES = ("disk_to_host_ms", "host_to_device_ms", "host_compute_ms", "device_compute_ms")
SHARED = (
    "on a CPU the device slots and the host cache are both host memory and the same cores "
    "compute from both: a copy is a memcpy and a host compute costs what a device one does"
)


def settings_of(settings: dict) -> dict:
    """tiers.harness with its defaults, checked against the model."""
    section = {
        "host": 32,
        "rule": "lru",
        "host_rule": "lru",
        "admissions": ["always", "bypass"],
        "sequences": 2,
        "tokens": 32,
        "repeats": 3,
    } | ((settings.get("tiers") or {}).get("harness") or {})
    arch, capacity = settings["model"]["architecture"], settings["harness"]["capacity"]
    host = section["host"]
    if host is not None and not capacity <= host <= arch["num_experts"]:
        raise MoecacheError(
            f"tiers.harness.host {host}: at least harness.capacity ({capacity}) and at most "
            f"the {arch['num_experts']} experts (null: no disk)"
        )
    return section


@dataclass
class Measured:
    """What the tiered decode measured, for the report."""

    cfg: dict  # tiers.harness with its defaults
    sequences: list  # the token ids decoded
    disk_read: str  # how a read avoids the page cache (disk_pool.DIRECT or FADVISE)
    prices: dict  # event -> its ms, measured apart (measure_prices)
    timed: dict  # arm -> seconds, NLL and streams (decode_arms)
    experts: int
    expert_bytes: int


def run(model, sequences, settings: dict, workdir: Path, gpu_check: dict | None = None) -> dict:
    """Measure the prices and decode every arm; the report a TiersMeasuredResult holds."""
    return report(settings, measure(model, sequences, settings, workdir), gpu_check)


def measure(model, sequences, settings: dict, workdir: Path) -> Measured:
    """The prices, measured before and after the decode, and every arm decoded; the disk
    file lives in a temporary folder under `workdir` while they run."""
    harness, arch = settings["harness"], settings["model"]["architecture"]
    cfg = settings_of(settings)
    sequences = [list(ids[: cfg["tokens"]]) for ids in sequences[: cfg["sequences"]]]
    layers, device = harness["restricted_layers"], torch.device(harness["device"])
    adapter = registry.of(model)
    adapter.check_sparse(model.config, layers)
    own = {layer: adapter.block(model, layer) for layer in layers}
    placement.offload_experts(model, layers, device)
    placement.release_staging(model)
    try:
        hosts = {
            layer: HostExperts(adapter.experts(mlp), arch["num_experts"], device)
            for layer, mlp in own.items()
        }
        with tempfile.TemporaryDirectory(dir=workdir, prefix="tiers-disk-") as folder:
            path = Path(folder) / "experts.safetensors"
            write_experts(path, hosts)
            disk = DiskExperts(path)
            try:
                seed, rounds, capacity = settings["seed"], [], harness["capacity"]

                def price_round():
                    prices = measure_prices(adapter, own, hosts, disk, capacity, seed + len(rounds))
                    rounds.append(prices)

                arms = build_arms(adapter, own, hosts, disk, settings, cfg)
                touch(hosts, disk)
                timed = decode_arms(model, adapter, arms, sequences, cfg, seed, price_round)
                price_round()
            finally:
                disk.close()
    finally:
        for layer, mlp in own.items():
            adapter.set_block(model, layer, mlp)
    some = next(iter(hosts.values()))
    prices = pooled(rounds, settings["seed"])
    return Measured(cfg, sequences, disk.mode, prices, timed, some.num_experts, some.expert_bytes)


def build_arms(adapter, own, hosts, disk, settings, cfg) -> dict[str, dict]:
    """Arm name -> layer -> TieredMoeBlock: the all-resident reference, then one per admission."""
    arch, capacity = settings["model"]["architecture"], settings["harness"]["capacity"]
    n, k = arch["num_experts"], arch["num_experts_per_tok"]
    arms = {RESIDENT: {}}
    for layer, mlp in own.items():
        tiers = LayerTiers(DeviceTier(causal_rule("lru", n, n, k), "always"), None)
        block = TieredMoeBlock(mlp, adapter, hosts[layer], hosts[layer].slots, tiers, None)
        block.hold_all()
        arms[RESIDENT][layer] = block
    for admission in cfg["admissions"]:
        arms[admission] = {}
        for layer, mlp in own.items():
            host = hosts[layer]
            device = DeviceTier(causal_rule(cfg["rule"], capacity, n, k), admission)
            cache, keeper = None, None
            if cfg["host"] is not None:
                cache = HostCache(host, cfg["host"], layer, disk)
                keeper = HostTier(causal_rule(cfg["host_rule"], cfg["host"], n, k))
            slots = host.new_slots(capacity)
            tiers = LayerTiers(device, keeper)
            arms[admission][layer] = TieredMoeBlock(mlp, adapter, host, slots, tiers, cache)
    return arms


@torch.inference_mode()
def decode_together(model, adapter, arms: dict, ids: list[int], shuffle) -> dict:
    """One sequence under every arm, token by token: every arm decodes token t, in an order
    shuffled per token, before any decodes t + 1, each with its own KV cache, so that the
    machine's load falls on all arms alike. Arm -> (seconds of each step, summed NLL)."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    clock, x = Clock(device), torch.tensor([ids], device=device)
    state = {}
    for name, blocks in arms.items():
        for block in blocks.values():
            block.reset()
        state[name] = {"cache": DynamicCache(config=model.config), "steps": [], "nll": 0.0}
    for t in range(len(ids)):
        for name in shuffle.sample(list(arms), len(arms)):
            for layer, block in arms[name].items():
                adapter.set_block(model, layer, block)
            s = state[name]
            started = clock.now()
            logits = model(input_ids=x[:, t : t + 1], cache=s["cache"], use_cache=True).logits
            s["steps"].append(clock.now() - started)
            if t + 1 < len(ids):
                s["nll"] -= torch.log_softmax(logits[0, -1].float(), -1)[ids[t + 1]].item()
    return {name: (s["steps"], s["nll"]) for name, s in state.items()}


def decode_arms(model, adapter, arms, sequences, cfg, seed: int, between=None) -> dict:
    """Per arm: per (sequence, repeat) each step's seconds, NLL and each layer's counts;
    counts must repeat exactly. `between()` runs before each repeat (a round of prices)."""
    shuffle = random.Random(seed)
    decode_together(model, adapter, arms, sequences[0][:WARMUP_TOKENS], shuffle)  # warm-up
    out = {name: {"seconds": [], "nll": [], "streams": {}} for name in arms}
    for repeat in range(cfg["repeats"]):
        if between is not None:
            between()
        for s, ids in enumerate(sequences):
            decoded = decode_together(model, adapter, arms, ids, shuffle)
            for name, (steps, nll) in decoded.items():
                arm = out[name]
                arm["seconds"].append((s, repeat, steps))
                arm["nll"].append(nll)
                for layer, block in arms[name].items():
                    keep_stream(name, arm["streams"], (layer, s), block, repeat)
    return out


def keep_stream(arm: str, streams: dict, key, block: TieredMoeBlock, repeat: int) -> None:
    counts = {e: block.counts[e] for e in EVENTS}
    if repeat == 0:
        streams[key] = {"counts": counts, "requests": block.requests, "times": []}
    elif streams[key]["counts"] != counts:
        raise MoecacheError(
            f"tiers harness, arm {arm}, layer {key[0]} sequence {key[1]}: counts changed "
            f"between repeats ({streams[key]['counts']} then {counts})"
        )
    streams[key]["times"].append({t: block.counts[t] for t in TIMES})


# --- the prices of one event, measured apart from any decode ---------------------------------


def touch(hosts: dict, disk) -> None:
    """Every expert read once, untimed: the disk's own cache (under the page cache, which
    the reads bypass) is then as warm for the prices as for the decode."""
    for layer in hosts:
        for e in range(hosts[layer].num_experts):
            disk.read(layer, e)


def measure_prices(adapter, own, hosts, disk, capacity: int, seed: int) -> dict:
    """Per event, the ms of each, in the order a device miss performs them: per layer, in a
    shuffled order, every expert read from disk into a host cache of them all, copied from
    there into the next of `capacity` device slots, and one token's matvec computed from
    its host slot (a bypassed miss, just read) and from its slot of the all-resident
    reference (a device hit, as c computes it)."""
    rng = random.Random(seed)
    samples = {key: [] for key in PRICES}
    for layer, mlp in own.items():
        host = hosts[layer]
        cache = HostCache(host, host.num_experts, layer, disk)
        kernel_host = kernel_over(adapter.experts(mlp), cache.slots)
        kernel_device = kernel_over(adapter.experts(mlp), host.slots)
        slots, clock = host.new_slots(capacity), Clock(host.device)
        width = next(iter(host.host.values())).shape[-1]
        x = torch.randn(1, width, dtype=cache.dtype).to(host.device)
        experts = list(range(host.num_experts))
        rng.shuffle(experts)
        for i, e in enumerate(experts):
            samples["disk_to_host_ms"].append(1e3 * cache.read(e))
            started = clock.now()
            for name, target in slots.items():
                target[i % capacity].copy_(cache.tensors(e)[name])
            samples["host_to_device_ms"].append(1e3 * (clock.now() - started))
            started = clock.now()
            host_matvec(kernel_host, cache.slot_of[e], x)
            samples["host_compute_ms"].append(1e3 * (clock.now() - started))
            started = clock.now()
            expert(kernel_device, e, x)
            samples["device_compute_ms"].append(1e3 * (clock.now() - started))
    return samples


def pooled(rounds: list[dict], seed: int) -> dict:
    """The prices measured before each repeat and after the last, pooled (the machine's
    load over the decode falls on them as on the arms)."""
    return {key: summary([v for r in rounds for v in r[key]], seed) for key in rounds[0]}


def summary(values: list[float], seed: int) -> dict:
    ones = np.ones(len(values))
    low, high = bootstrap_ratio(values, ones, seed)
    return {
        "ms": float(np.mean(values)),
        "ci": [float(low), float(high)],
        "median_ms": float(statistics.median(values)),
        "events": len(values),
    }


# --- the report --------------------------------------------------------------------------------


def report(settings: dict, m: Measured, gpu_check: dict | None = None) -> dict:
    """Per admission: measured and predicted ms/token, the counts, and their ratio."""
    harness, cfg, sequences, timed = settings["harness"], m.cfg, m.sequences, m.timed
    tokens = sum(len(ids) for ids in sequences)
    resident = measured(timed[RESIDENT], sequences, settings["seed"])
    decide = {
        name: in_run(arm["streams"], {}, tokens)["decide_ms_per_token"]
        for name, arm in timed.items()
    }
    resident["bookkeeping_ms_per_token"] = decide[RESIDENT]
    unit = {key: row["ms"] for key, row in m.prices.items()}
    scored = cfg["repeats"] * sum(len(ids) - 1 for ids in sequences)
    rows = {}
    for admission in cfg["admissions"]:
        arm = timed[admission]
        row = measured(arm, sequences, settings["seed"])
        counts = totals(arm["streams"])
        c = resident["ms_per_token"]
        bookkeeping = decide[admission] - decide[RESIDENT]
        predicted = equation.tier_ms_per_token(c, tokens, counts, unit, bookkeeping)
        events_only = equation.tier_ms_per_token(c, tokens, counts, unit)
        ratio = predicted / row["ms_per_token"]
        rows[admission] = {
            **row,
            **counts,
            "per_layer": per_layer(arm["streams"]),
            "streams": stream_rows(arm["streams"]),
            "timed_in_run_ms": in_run(arm["streams"], counts, tokens),
            "delta_nll": (sum(arm["nll"]) - sum(timed[RESIDENT]["nll"])) / scored,
            "bookkeeping_ms_per_token": decide[admission],
            "predicted_ms_per_token": predicted,
            "predicted_without_bookkeeping_ms_per_token": events_only,
            "ratio_without_bookkeeping": events_only / row["ms_per_token"],
            "ratio": ratio,
            "within_10pct": bool(abs(ratio - 1) <= equation.TIER_WITHIN),
        }
    device = torch.device(harness["device"])
    return {
        "capacity": harness["capacity"],
        "host": cfg["host"],
        "rule": cfg["rule"],
        "host_rule": cfg["host_rule"],
        "layers": list(harness["restricted_layers"]),
        "experts": m.experts,
        "expert_bytes": m.expert_bytes,
        "sequences": len(sequences),
        "tokens": tokens,
        "repeats": cfg["repeats"],
        "disk_read": m.disk_read,
        "shared_processor": device.type == "cpu",
        "shared_processor_note": SHARED if device.type == "cpu" else None,
        "prices": m.prices,
        "equation": equation.TIER_EQUATION,
        "resident": resident,
        "admissions": rows,
        "gpu_check": gpu_pricing(gpu_check, m.prices, m.expert_bytes),
    }


def measured(arm: dict, sequences, seed: int) -> dict:
    """Measured ms/token: each token's step, the median over the repeats (a step another
    process preempted once does not count), summed over every sequence's tokens; a
    bootstrap interval over tokens, and each repeat's own ms/token (every step counted)."""
    steps = {}  # (sequence, t) -> that step's ms in each repeat
    per_repeat = {}
    for s, repeat, seconds in arm["seconds"]:
        for t, step in enumerate(seconds):
            steps.setdefault((s, t), []).append(1e3 * step)
        total, count = per_repeat.get(repeat, (0.0, 0))
        per_repeat[repeat] = (total + 1e3 * sum(seconds), count + len(seconds))
    medians = [statistics.median(ms) for ms in steps.values()]
    low, high = bootstrap_ratio(medians, np.ones(len(medians)), seed)
    return {
        "ms_per_token": sum(medians) / len(medians),
        "ms_per_token_ci": [low, high],
        "repeats_ms_per_token": [total / count for total, count in per_repeat.values()],
    }


def totals(streams: dict) -> dict:
    return {e: sum(s["counts"][e] for s in streams.values()) for e in EVENTS}


def per_layer(streams: dict) -> dict:
    out = {}
    for (layer, _), s in streams.items():
        row = out.setdefault(str(layer), dict.fromkeys(EVENTS, 0))
        for e in EVENTS:
            row[e] += s["counts"][e]
    return out


def stream_rows(streams: dict) -> list[dict]:
    return [
        {"layer": layer, "sequence": s, **row["counts"]}
        for (layer, s), row in sorted(streams.items())
    ]


def in_run(streams: dict, counts: dict, tokens: int) -> dict:
    """The events as the decode timed them (per stream, the median over repeats): ms per
    event, and per token the tiers' deciding what moves (the bookkeeping)."""

    def mean_seconds(key):
        return sum(statistics.median(t[key] for t in s["times"]) for s in streams.values())

    def per(key, count):
        count = counts.get(count, 0)
        return 1e3 * mean_seconds(key) / count if count else None

    return {
        "disk_to_host_ms": per("read_seconds", "reads"),
        "host_to_device_ms": per("copy_seconds", "copies"),
        "host_compute_ms": per("compute_seconds", "computes"),
        "decide_ms_per_token": 1e3 * mean_seconds("decide_seconds") / tokens,
    }


def gpu_pricing(check: dict | None, prices: dict, expert_bytes: int) -> dict:
    """The device side priced by a committed GPU check: its measured copy time of its own
    expert against this machine's host matvec scaled to that expert's bytes."""
    if check is None:
        return {"committed": False, "note": "no GPU check file is committed (measured/gpu-check/)"}
    tau, size = check["tau_ms"], check["expert_bytes"]
    host_ms = prices["host_compute_ms"]["ms"] * size / expert_bytes
    return {
        "committed": True,
        "device_name": check.get("device_name"),
        "tau_ms": tau,
        "expert_bytes": size,
        "host_compute_ms_scaled": host_ms,
        "host_compute_to_copy": host_ms / tau,
        "note": (
            "this machine's host matvec of one expert scaled by bytes to the GPU check's "
            "expert, over that GPU's measured copy of it; above 1 a copy is cheaper than "
            "computing the miss on this host"
        ),
    }


# --- the job and its check ---------------------------------------------------------------------


def job(settings: dict, model_source: str, sequences_path, out: Path, gpu_check=None) -> dict:
    """`moecache tiers-harness`: one TiersMeasuredResult at `out` (the disk file lives in a
    temporary folder beside it while the arms decode). `gpu_check`: a committed GPU check
    file, which prices the device side (None: the record says none is committed)."""
    from moecache import provenance
    from moecache.harness import jobs
    from moecache.records.tiers_measured import TiersMeasuredResult

    check = None if gpu_check is None else read_gpu_check(gpu_check)
    model, sequences = jobs.load(settings, model_source, sequences_path)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report_ = run(model, sequences, settings, out.parent, check)
    device = settings["harness"]["device"]
    return provenance.write_results(out, report_, settings, device, kind=TiersMeasuredResult)


def read_gpu_check(path) -> dict:
    import json

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise MoecacheError(f"{path}: not a readable GPU check file ({error})") from None
    missing = [key for key in ("tau_ms", "expert_bytes") if key not in data]
    if missing:
        raise MoecacheError(f"{path}: a GPU check file without {', '.join(missing)}")
    kept = ("device_name", "tau_ms", "expert_bytes")
    return {"file": str(path), **{key: data.get(key) for key in kept}}


def check_lines(record: dict) -> tuple[list[str], bool]:
    """One line per admission (measured, predicted, their ratio) and whether every one is
    within TIER_WITHIN: `moecache tiers-check` exits non-zero when not."""
    lines, ok = [], True
    c = record["resident"]["ms_per_token"]
    for admission, row in record["admissions"].items():
        low, high = row["ms_per_token_ci"]
        verdict = "within" if row["within_10pct"] else "NOT within"
        ok &= row["within_10pct"]
        lines.append(
            f"{admission}: measured {row['ms_per_token']:.3f} ms/token [{low:.3f}, {high:.3f}], "
            f"predicted {row['predicted_ms_per_token']:.3f} (c {c:.3f}; copies {row['copies']}, "
            f"reads {row['reads']}, computes {row['computes']}), ratio {row['ratio']:.3f}: "
            f"{verdict} {equation.TIER_WITHIN:.0%}"
        )
    return lines, ok
