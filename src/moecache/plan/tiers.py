"""The tier layout of `moecache plan --gpu-gib G --host-gib R` (docs/plan.md, issue 40
point 5): per offloaded layer, C experts on the device, H in host RAM and N - H on disk
only, and the disk reads per token that add a term to equation (1),

    ms/token = c + rho * tau + reads * tau_disk.

H is the most experts per layer whose pinned copies fit R beside what else the plan's host
peak counts (accountant.account's sizes); where H = N nothing lies on disk only and the prediction
is plan's own. The reads come from the tiered replay (replay/tiers.py) of a given trace
at C over H, or, without one, from a stated assumption named as such.
"""

from __future__ import annotations

import numpy as np

from moecache import config as configs
from moecache.errors import MoecacheError
from moecache.replay import tier_report
from moecache.replay import tiers as tiered

GIB = 2**30


def layout(chosen: dict, host_peak_bytes: int, host_gib: float | None) -> dict:
    """Experts per layer on the device (C), in host RAM (H) and on disk only (N - H).

    The host counts H experts of every offloaded layer at plan's expert bytes, pinned (as
    plan's pinned_host_bytes counts all N), beside the rest of `host_peak_bytes` (the
    slower link's host ring, for the study's jobs; nothing for one run). Not counted, as
    plan does not count them: the process's own memory and the page cache. Without
    `host_gib` the host holds every expert, as before. Refused in one line where the
    host holds fewer than the device's C (a host cache holds at least the device's:
    docs/tiers.md), or, where the host holds every expert (the harness's own jobs), where
    loading the checkpoint peaks above `host_gib` (check_load). With experts on disk only
    the layout is a server's that reads them from there, not the harness's loading, whose
    peak (`load_peak_bytes`) is reported beside it unchecked."""
    n, c = chosen["num_experts"], chosen["capacity"]
    layers = len(chosen["offloaded_layers"])
    row = chosen["expert_bytes"] * layers  # one expert more in every offloaded layer
    beside = host_peak_bytes - chosen["pinned_host_bytes"]
    if host_gib is None:
        host = n
    else:
        host = min(n, max(0, int((host_gib * GIB - beside) // row)))
    if host == n:  # the harness's own jobs, which load the whole checkpoint first
        check_load(chosen, host_gib)
    if host < c:
        raise MoecacheError(
            f"--host-gib {host_gib:g}: host RAM holds {host} experts per layer "
            f"({row / GIB:.3f} GiB each over {layers} layers"
            + (f", beside {beside / GIB:.3f} GiB of ring" if beside else "")
            + f"), fewer than the device's C = {c}; a host cache holds at least the device's"
        )
    return {
        "device": c,
        "host": host,
        "disk": n - host,
        "host_bytes": host * row + beside,
        "host_beside_bytes": beside,
        "every_expert_host_bytes": host_peak_bytes,
        "load_peak_bytes": chosen.get("host_load_peak_bytes"),
        "host_gib": host_gib,
    }


def check_load(chosen: dict, host_gib: float | None) -> None:
    """Refused in one line where a job's load phase (plan.loading: transformers reading the
    checkpoint, whatever the tiers hold afterwards) peaks above `host_gib`, naming its
    parts: the checkpoint's files, the experts read in place, those transformers fuses and
    a pair's stacks."""
    peak = chosen.get("host_load_peak_bytes")
    if host_gib is None or peak is None or peak <= host_gib * GIB:
        return
    raise MoecacheError(
        f"--host-gib {host_gib:g}: loading the checkpoint peaks at {peak / GIB:.3f} GiB of "
        f"host memory, over {host_gib:g} GiB: its files {chosen['checkpoint_file_bytes'] / GIB:.3f}"
        f" GiB, mapped while read, beside the experts read from them in place, "
        f"{chosen['read_experts_bytes'] / GIB:.3f} GiB, the experts transformers fuses, "
        f"{chosen['fused_experts_bytes'] / GIB:.3f} GiB, and one pair's stacks while it fuses "
        f"them, {chosen['fusing_stacks_bytes'] / GIB:.3f} GiB"
    )


def disk_read(expert_bytes: int, settings: dict, disk_gbs: float | None) -> dict:
    """tau_disk, one expert read from disk into host RAM: a stated disk link's (its bytes
    over `disk_gbs` GiB/s), else the config's tiers.disk_to_host_ms, else its default."""
    if disk_gbs is not None:
        check_disk_gbs(disk_gbs)
        return {
            "ms": 1e3 * expert_bytes / (disk_gbs * GIB),
            "gib_per_s": disk_gbs,
            "source": f"stated: a disk of {disk_gbs:g} GiB/s (--disk-gbs), not measured",
        }
    ms = tier_report.prices(settings.get("tiers"))["disk_to_host_ms"]
    if ms != configs.schema_default("tiers", "disk_to_host_ms"):
        source = "the config's tiers.disk_to_host_ms, one expert read as stated there"
    else:
        source = (
            "tiers.disk_to_host_ms's default, illustrative (ten times an OLMoE-1B-7B copy, "
            "docs/tiers.md): not measured, not scaled to this expert; give --disk-gbs X "
            "or the config's tiers.disk_to_host_ms"
        )
    return {"ms": ms, "gib_per_s": None, "source": source}


def check_disk_gbs(disk_gbs: float) -> None:
    if disk_gbs <= 0:
        raise MoecacheError(f"--disk-gbs {disk_gbs:g}: must be above 0")


def no_reads(rules) -> dict:
    """Every expert in host RAM: nothing read from disk."""
    return {"per_token": {rule: 0.0 for rule in rules}, "source": "nothing on disk only"}


def reads_assumed(copies: dict, capacity: int, host: int, experts: int) -> dict:
    """Without a trace: each device copy reads from disk with probability (N - H)/(N - C),
    as if the copies fell evenly on the N - C experts off the device and the host held
    the device's C and H - C of the others (no reuse the host catches beyond that)."""
    share = (experts - host) / (experts - capacity)
    return {
        "per_token": {rule: rho * share for rule, rho in copies.items()},
        "source": (
            f"assumed, no --trace given: each device copy (rho above) reads from disk with "
            f"probability (N - H)/(N - C) = {experts - host}/{experts - capacity} = "
            f"{share:.3f}, as if copies fell evenly on the experts off the device and the "
            "host held the device's C and H - C others; not a replay of this model's routing"
        ),
    }


def reads_replayed(traced: dict, capacity: int, host: int, layers: int, rules) -> dict:
    """Disk reads per token over `layers` offloaded layers: the trace replayed over the
    tiers at C and H (admission always, each rule on both tiers), per stream the reads
    after the empty host's first H (the host only evicts once full, so those are its
    fill), per timed token over the trace's layers, per layer, times `layers`."""
    demand = traced["demand"]
    per_token = {}
    for rule in rules:
        counts = tiered.run(demand, rule, capacity, host, host_rule=rule, admission="always")
        steady = int(np.maximum(counts.reads - host, 0).sum())
        per_token[rule] = steady / traced["timed"] / traced["layers"] * layers
    return {
        "per_token": per_token,
        "source": (
            f"replayed: {traced['path']} ({traced['layers']} layers, {traced['timed']} timed "
            f"tokens) over the tiers at C = {capacity}, H = {host} (replay --tiers, admission "
            "always, each rule on both tiers: not the two-tier optimum), reads after each "
            f"stream's first H, per layer times {layers} layers"
        ),
    }
