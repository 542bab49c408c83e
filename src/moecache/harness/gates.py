"""Exactness gates and the throughput gate, run before any decode result counts.

LRU, Dwell-1 with a one-token window and the pool at C = N preserve every routing decision,
so they must reproduce the unmodified model's NLL; the unmodified model's token-by-token
NLL must reproduce an independent batched evaluation of whole sequences; and the pooled
block at C = N, decoded with the model's own block token by token (each token by both, in
turn, before the next), must reach `harness.min_throughput_ratio` of its tokens/s.
"""

from __future__ import annotations

from moecache.errors import MoecacheError
from moecache.harness import decode, link
from moecache.intervals import bootstrap_ratio
from moecache.model import registry

POOL_TOLERANCE = 5e-3
BATCHED_TOLERANCE = 4e-4
MIN_THROUGHPUT_RATIO = 0.95
GATE_REPEATS = 3


def lossless_runs(capacity: int, num_experts: int) -> dict[str, tuple[dict, int]]:
    return {
        "lru": ({"policy": "lru"}, capacity),
        "dwell-1-window-1": ({"policy": "dwell", "params": {"k": 1, "window": 1}}, capacity),
        "all-resident": ({"policy": "all"}, num_experts),
    }


def run(model, sequences, harness: dict, seed: int = 0) -> dict:
    device, layers = harness["device"], harness["restricted_layers"]
    sizes = registry.of(model).sizes(model.config)
    num_experts, top_k = sizes.num_experts, sizes.num_experts_per_tok
    runs = lossless_runs(harness["capacity"], num_experts)
    ring = link.ring_mib(harness)
    slots = harness["capacity"] * len(layers)
    kind = link.configured(harness)
    with decode.offloaded(
        model, layers, num_experts, device, ring, keep_own=True, slots=slots, link=kind
    ) as off:
        arms = {"base": decode.Arm("base", {})} | {
            name: off.arm(name, decode.policy_factory(spec, capacity, num_experts, top_k), capacity)
            for name, (spec, capacity) in runs.items()
        }
        results = {}
        # The own block and the pool at C = N token by token (their speeds are compared),
        # then the other lossless runs, which share the pool's slots, sequence by sequence.
        compared = ["base", "all-resident"]
        others = [name for name in runs if name not in compared]
        # The compared pair is timed over `gate_repeats` passes, each sequence keeping its
        # median, so that one disturbed stretch of a shared machine cannot decide the gate;
        # the others are decoded once, for their NLL.
        passes = ((compared, True, harness.get("gate_repeats", GATE_REPEATS)), (others, False, 1))
        for names, lockstep, repeats in passes:
            arms_now = [arms[name] for name in names]
            results |= decode.decode(
                model,
                sequences,
                device,
                arms_now,
                off.own,
                harness["warmup_tokens"],
                repeats,
                seed,
                lockstep=lockstep,
            )
    base, pooled = results["base"], results["all-resident"]
    report = {
        "base": base["totals"],
        "batched_nll": decode.batched_nll(model, sequences, device),
        "runs": {name: results[name]["totals"] for name in runs},
        "throughput_ratio_pool_vs_own_block": (
            pooled["totals"]["tokens_per_second"] / base["totals"]["tokens_per_second"]
        ),
        # Paired over the same sequences: own-block seconds over pooled seconds.
        "throughput_ratio_ci": bootstrap_ratio(
            [r["step_seconds"] for r in base["sequences"]],
            [r["step_seconds"] for r in pooled["sequences"]],
            seed,
        ),
        "min_throughput_ratio": harness.get("min_throughput_ratio", MIN_THROUGHPUT_RATIO),
        "gate_repeats": passes[0][2],
        # Per sequence (median pass), so that a slow stretch can be found in the ratio's spread.
        "step_seconds": {
            name: [r["step_seconds"] for r in results[name]["sequences"]] for name in compared
        },
    }
    report["failures"] = failures(report)
    return report


def failures(report: dict) -> list[str]:
    base = report["base"]["nll"]
    found = []
    gap = abs(base - report["batched_nll"])
    tolerance = report.get("batched_tolerance", BATCHED_TOLERANCE)  # the GPU check's bfloat16
    if not gap <= tolerance:  # written so that a NaN fails too
        found.append(
            f"teacher-forced NLL {base:.6f} vs batched {report['batched_nll']:.6f} "
            f"(|diff| {gap:.2e} > {tolerance:.1e})"
        )
    for name, totals in report["runs"].items():
        gap = abs(totals["nll"] - base)
        if not gap <= POOL_TOLERANCE:
            found.append(
                f"{name} NLL {totals['nll']:.6f} vs base {base:.6f} "
                f"(|diff| {gap:.2e} > {POOL_TOLERANCE:.0e})"
            )
    ratio, floor = report["throughput_ratio_pool_vs_own_block"], report["min_throughput_ratio"]
    if not ratio >= floor:
        low, high = report["throughput_ratio_ci"]
        found.append(
            f"pooled block at C = N reaches {ratio:.3f} of the own block's tokens/s "
            f"(95% interval {low:.3f}-{high:.3f}; "
            f"{report['runs']['all-resident']['tokens_per_second']:.1f} against "
            f"{report['base']['tokens_per_second']:.1f}), below harness.min_throughput_ratio "
            f"{floor}"
        )
    return found


def check(report: dict) -> None:
    if report["failures"]:
        raise MoecacheError("gate failed: " + "; ".join(report["failures"]))
