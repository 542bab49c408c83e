"""Exactness gates and the throughput gate, run before any decode result counts.

LRU, Dwell-1 with a one-token window and the pool at C = N preserve every routing decision,
so they must reproduce the unmodified model's NLL; the unmodified model's token-by-token
NLL must reproduce an independent batched evaluation of whole sequences; and the pooled
block at C = N, decoded with the model's own block token by token (each token by both, in
turn, before the next), must reach `harness.min_throughput_ratio` of its tokens/s.
"""

from __future__ import annotations

import gc

from moecache.config import run_spec
from moecache.errors import MoecacheError
from moecache.harness import decode, link, nll
from moecache.intervals import bootstrap_ratio
from moecache.model import registry
from moecache.model.memory import ring_mib
from moecache.records.gates import BATCHED_TOLERANCE, POOL_TOLERANCE


def lossless_runs(capacity: int, num_experts: int, reference=True) -> dict[str, tuple[dict, int]]:
    """The gates' lossless runs; `reference`: with the pool at C = N (where the device holds
    it: schedule/accountant.py reference_left_out)."""
    runs = {
        "lru": (run_spec("lru"), capacity),
        "dwell-1-window-1": (run_spec("dwell", {"k": 1, "window": 1}), capacity),
        "all-resident": (run_spec("all"), num_experts),
    }
    return runs if reference else {k: v for k, v in runs.items() if k != "all-resident"}


def run(model, sequences, harness: dict, seed: int = 0, left_out: str | None = None) -> dict:
    """`left_out`: why the pool at C = N does not run (its exactness and throughput gates are
    then not checked, and the report says why)."""
    num_experts = registry.of(model).sizes(model.config).num_experts
    runs = lossless_runs(harness["capacity"], num_experts, left_out is None)
    # The own block and the pool at C = N token by token (their speeds are compared),
    # then the other lossless runs, which share the pool's slots, sequence by sequence.
    compared = ["base", "all-resident"] if left_out is None else ["base"]
    repeats = harness["gate_repeats"]
    results = decode_gate_runs(model, sequences, harness, runs, compared, repeats, seed)
    # Every reference to the arms' pools went with decode_gate_runs' frame: collected now,
    # so that the slots are given back before the whole-sequence evaluation stages a layer
    # beside them.
    gc.collect()
    base = results["base"]
    report = {
        "base": base["totals"],
        "batched_nll": nll.batched_nll(model, sequences, harness["device"]),
        "runs": {name: results[name]["totals"] for name in runs},
        "reference_left_out": left_out,
        "min_throughput_ratio": harness["min_throughput_ratio"],
        "gate_repeats": repeats,
        # Per sequence (median pass), so that a slow stretch can be found in the ratio's spread.
        "step_seconds": {
            name: [r["step_seconds"] for r in results[name]["sequences"]] for name in compared
        },
    }
    if left_out is None:
        report |= throughput_ratio(base, results["all-resident"], seed)
    report["failures"] = failures(report)
    return report


def decode_gate_runs(
    model, sequences, harness: dict, runs: dict, compared: list, repeats: int, seed: int
) -> dict:
    """The own block ("base") and every lossless run decoded: the `compared` pair token by
    token over `repeats` passes, the others sequence by sequence once; results per name."""
    device, layers = harness["device"], harness["restricted_layers"]
    sizes = registry.of(model).sizes(model.config)
    num_experts, top_k = sizes.num_experts, sizes.num_experts_per_tok
    ring = ring_mib(harness)
    slots = harness["capacity"] * len(layers)
    kind = link.configured(harness)
    # One slot storage for every gate run, decoded one after another; the own-block arm's
    # experts are staged onto the device one layer at a time (harness/placement.py).
    most = max(capacity for _, capacity in runs.values())
    with decode.offloaded(model, layers, most, device, ring, slots=slots, link=kind) as off:
        arms = {"base": decode.Arm("base", {})} | {
            name: off.arm(name, decode.policy_factory(spec, capacity, num_experts, top_k), capacity)
            for name, (spec, capacity) in runs.items()
        }
        results = {}
        others = [name for name in runs if name not in compared]
        # The compared pair is timed over `gate_repeats` passes, each sequence keeping its
        # median, so that one disturbed stretch of a shared machine cannot decide the gate;
        # the others are decoded once, for their NLL.
        for names, lockstep, passes in ((compared, True, repeats), (others, False, 1)):
            results |= decode.decode(
                model,
                sequences,
                device,
                [arms[name] for name in names],
                off.own,
                harness["warmup_tokens"],
                passes,
                seed,
                lockstep=lockstep,
            )
    return results


def throughput_ratio(base: dict, pooled: dict, seed: int) -> dict:
    """The pooled block at C = N's tokens/s over the own block's, and its interval."""
    return {
        "throughput_ratio_pool_vs_own_block": (
            pooled["totals"]["tokens_per_second"] / base["totals"]["tokens_per_second"]
        ),
        # Paired over the same sequences: own-block seconds over pooled seconds.
        "throughput_ratio_ci": bootstrap_ratio(
            [r["step_seconds"] for r in base["sequences"]],
            [r["step_seconds"] for r in pooled["sequences"]],
            seed,
        ),
    }


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
    if report.get("reference_left_out"):
        return found
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
