"""The tiers measured for real: the arms decoded (issue 40, point 3; docs/tiers.md,
"Measured in the harness").

The restricted layers' experts go to a safetensors file on disk. The arms decode the first
few held-out sequences token by token with the KV cache, `repeats` times, together: every
arm decodes token t, in an order shuffled per token, before any decodes t + 1. The arms are
the all-resident reference (every expert in a device slot, nothing moves: its ms/token is
equation (1)'s c) and one tiered arm per admission (C device slots over a host cache of H
experts over the disk, tier_block.py), its moves decided by policies/tiers.py, the schedule
the tiered replay runs too, under rules that read only the past (causal_rule). Before each
repeat and after the last, a round of prices is measured apart from any decode
(tier_prices.py); tier_record.py turns all of it into the record.
"""

from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from moecache import config as configs
from moecache import policies
from moecache.errors import MoecacheError
from moecache.harness import placement
from moecache.harness.disk_pool import DiskExperts, HostCache, write_experts
from moecache.harness.host_compute import Clock
from moecache.harness.pool import HostExperts
from moecache.harness.tier_block import EVENTS, TIMES, TieredMoeBlock
from moecache.harness.tier_prices import measure_prices, pooled, touch
from moecache.model import registry
from moecache.policies import EvictionPolicy
from moecache.policies.tiers import DeviceTier, HostTier, LayerTiers
from moecache.records.shape import check_shape

RESIDENT = "all-resident"
ADMISSION = "harness.tiers admission"  # names an unknown admission
WARMUP_TOKENS = 8
SHARED = (
    "on a CPU the device slots and the host cache are both host memory and the same cores "
    "compute from both: a copy is a memcpy and a host compute costs what a device one does"
)


def settings_of(settings: dict) -> dict:
    """harness.tiers (filled in as it loaded; all defaults when the config has none, as a
    `moecache tiers-harness` outside the workflow may), checked against the model."""
    section = settings["harness"].get("tiers") or configs.with_defaults({}, "harness", "tiers")
    arch, capacity = settings["model"]["architecture"], settings["harness"]["capacity"]
    host = section["host"]
    if host is not None:
        where, note = f"harness.tiers.host {host}", "capacity is harness.capacity; null: no disk"
        check_shape(None, capacity, arch["num_experts"], host, where=where, note=note)
    return section


def causal_rule(name: str, capacity: int, num_experts: int, top_k: int) -> EvictionPolicy:
    """A ranked eviction rule that needs neither the future nor router probabilities (a
    decode does not know the future; farthest-future would need a recorded trace)."""
    policy = policies.make(name, capacity, num_experts, top_k, {})
    if not isinstance(policy, EvictionPolicy) or policy.needs_future or policy.needs_probs:
        raise MoecacheError(
            f"harness.tiers rule {name}: the tiered harness runs ranked rules that read only "
            "past requests (lru, decayed-frequency, ...)"
        )
    return policy


@dataclass
class Measured:
    """What the tiered decode measured, for the report."""

    cfg: dict  # harness.tiers with its defaults
    sequences: list  # the token ids decoded
    disk_read: str  # how a read avoids the page cache (disk_pool.DIRECT or FADVISE)
    prices: dict  # event -> its ms, measured apart (measure_prices)
    timed: dict  # arm -> seconds, NLL and streams (decode_arms)
    experts: int
    expert_bytes: int


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
        tiers = LayerTiers(DeviceTier(causal_rule("lru", n, n, k), "always", ADMISSION), None)
        block = TieredMoeBlock(mlp, adapter, hosts[layer], hosts[layer].slots, tiers, None)
        block.hold_all()
        arms[RESIDENT][layer] = block
    for admission in cfg["admissions"]:
        arms[admission] = {}
        for layer, mlp in own.items():
            host = hosts[layer]
            device = DeviceTier(causal_rule(cfg["rule"], capacity, n, k), admission, ADMISSION)
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
        streams[key]["device_computes"] = block.counts["device_computes"]
    elif streams[key]["counts"] != counts:
        raise MoecacheError(
            f"tiers harness, arm {arm}, layer {key[0]} sequence {key[1]}: counts changed "
            f"between repeats ({streams[key]['counts']} then {counts})"
        )
    streams[key]["times"].append({t: block.counts[t] for t in TIMES})
