"""The tiers measured in the harness as a record (a TiersMeasuredResult's fields): per
admission the measured ms/token, the counts, equation (1) with a term per tier
(costs/tier_equation.py) and their ratio; the job (`moecache tiers-harness`) and its check
(`moecache tiers-check`). docs/tiers.md, "Measured in the harness".
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import torch

from moecache.costs import tier_equation
from moecache.errors import MoecacheError
from moecache.harness.tier_block import EVENTS
from moecache.harness.tier_runs import RESIDENT, SHARED, Measured, measure
from moecache.intervals import bootstrap_ratio


def run(model, sequences, settings: dict, workdir: Path, gpu_check: dict | None = None) -> dict:
    """Measure the prices and decode every arm; the report a TiersMeasuredResult holds."""
    return report(settings, measure(model, sequences, settings, workdir), gpu_check)


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
    apart = {key: row["ms"] for key, row in m.prices.items()}
    timed_prices = run_prices(timed, cfg["admissions"])
    scored = cfg["repeats"] * sum(len(ids) - 1 for ids in sequences)
    c, rows = pool_c(resident["ms_per_token"], timed, tokens, timed_prices), {}
    resident["c_ms_per_token"] = c
    for admission in cfg["admissions"]:
        arm = timed[admission]
        row = measured(arm, sequences, settings["seed"])
        counts = totals(arm["streams"])
        bookkeeping = decide[admission] - decide[RESIDENT]
        predicted = tier_equation.tier_ms_per_token(c, tokens, counts, timed_prices, bookkeeping)
        from_apart = tier_equation.tier_ms_per_token(c, tokens, counts, apart, bookkeeping)
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
            "ratio": ratio,
            "within_10pct": bool(abs(ratio - 1) <= tier_equation.TIER_WITHIN),
            "predicted_from_prices_apart_ms_per_token": from_apart,
            "ratio_from_prices_apart": from_apart / row["ms_per_token"],
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
        "run_prices": timed_prices,
        "equation": tier_equation.TIER_EQUATION,
        "resident": resident,
        "admissions": rows,
        "gpu_check": gpu_pricing(gpu_check, m.prices, m.expert_bytes),
    }


def measured(arm: dict, sequences, seed: int) -> dict:
    """Measured ms/token: every step of every repeat, as the events are (a mean: what a
    sum of parts predicts); a bootstrap interval over tokens (each token's mean over the
    repeats), and each repeat's own ms/token."""
    steps = {}  # (sequence, t) -> that step's ms in each repeat
    per_repeat = {}
    for s, repeat, seconds in arm["seconds"]:
        for t, step in enumerate(seconds):
            steps.setdefault((s, t), []).append(1e3 * step)
        total, count = per_repeat.get(repeat, (0.0, 0))
        per_repeat[repeat] = (total + 1e3 * sum(seconds), count + len(seconds))
    means = [statistics.mean(ms) for ms in steps.values()]
    low, high = bootstrap_ratio(means, np.ones(len(means)), seed)
    return {
        "ms_per_token": sum(means) / len(means),
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
    """The events as the decode timed them (per stream, the mean over repeats): ms per
    event, and per token the tiers' deciding what moves (the bookkeeping)."""

    def mean_seconds(key):
        return sum(statistics.mean(t[key] for t in s["times"]) for s in streams.values())

    def per(key, count):
        count = counts.get(count, 0)
        return 1e3 * mean_seconds(key) / count if count else None

    return {
        "disk_to_host_ms": per("read_seconds", "reads"),
        "host_to_device_ms": per("copy_seconds", "copies"),
        "host_compute_ms": per("compute_seconds", "computes"),
        "decide_ms_per_token": 1e3 * mean_seconds("decide_seconds") / tokens,
    }


def run_prices(timed: dict, admissions) -> dict:
    """Each event's ms as the decode timed it, over every arm that has such events (the
    mean over repeats of each stream's seconds, summed, over the events): reads, copies
    and host computes in the tiered arms, device computes in every arm."""

    def price(key, count, arms):
        streams = [s for name in arms for s in timed[name]["streams"].values()]
        seconds = sum(statistics.mean(t[key] for t in s["times"]) for s in streams)
        events = sum(count(s) for s in streams)
        return 1e3 * seconds / events if events else 0.0

    return {
        "disk_to_host_ms": price("read_seconds", lambda s: s["counts"]["reads"], admissions),
        "host_to_device_ms": price("copy_seconds", lambda s: s["counts"]["copies"], admissions),
        "host_compute_ms": price("compute_seconds", lambda s: s["counts"]["computes"], admissions),
        "device_compute_ms": price("device_seconds", lambda s: s["device_computes"], admissions),
    }


def pool_c(c_ms: float, timed: dict, tokens: int, prices: dict) -> float:
    """c with the reference's device computes at the pools' price: the reference reads each
    expert from N slots, a pool from C; on a CPU whose caches hold C experts and not N,
    the difference is the processor's cache, not a tier event."""
    streams = timed[RESIDENT]["streams"].values()
    seconds = sum(statistics.mean(t["device_seconds"] for t in s["times"]) for s in streams)
    computes = sum(s["device_computes"] for s in streams)
    return c_ms + (computes * prices["device_compute_ms"] - 1e3 * seconds) / tokens


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
    c = record["resident"]["c_ms_per_token"]
    for admission, row in record["admissions"].items():
        low, high = row["ms_per_token_ci"]
        verdict = "within" if row["within_10pct"] else "NOT within"
        ok &= row["within_10pct"]
        lines.append(
            f"{admission}: measured {row['ms_per_token']:.3f} ms/token [{low:.3f}, {high:.3f}], "
            f"predicted {row['predicted_ms_per_token']:.3f} (c {c:.3f}; copies {row['copies']}, "
            f"reads {row['reads']}, computes {row['computes']}), ratio {row['ratio']:.3f}: "
            f"{verdict} {tier_equation.TIER_WITHIN:.0%}"
        )
    return lines, ok
