"""Exactness gates, run before any decode result counts.

LRU, Dwell-1 with a one-token window and the pool at C = N preserve every routing decision,
so they must reproduce the unmodified model's NLL; and the unmodified model's token-by-token
NLL must reproduce an independent batched evaluation of whole sequences.
"""

from __future__ import annotations

from moecache.errors import MoecacheError
from moecache.harness import decode

POOL_TOLERANCE = 5e-3
BATCHED_TOLERANCE = 4e-4


def lossless_runs(capacity: int, num_experts: int) -> dict[str, tuple[dict, int]]:
    return {
        "lru": ({"policy": "lru"}, capacity),
        "dwell-1-window-1": ({"policy": "dwell", "params": {"k": 1, "window": 1}}, capacity),
        "all-resident": ({"policy": "all"}, num_experts),
    }


def run(model, sequences, harness: dict, warmup_tokens: int) -> dict:
    device, layers = harness["device"], harness["restricted_layers"]
    num_experts, top_k = model.config.num_experts, model.config.num_experts_per_tok
    base = decode.decode(model, sequences, device, warmup_tokens=warmup_tokens, label="base")
    report = {
        "base": base["totals"],
        "batched_nll": decode.batched_nll(model, sequences, device),
        "runs": {},
    }
    for name, (spec, capacity) in lossless_runs(harness["capacity"], num_experts).items():
        make = decode.policy_factory(spec, capacity, num_experts, top_k)
        with decode.pooled(model, layers, capacity, device, 1, make) as blocks:
            result = decode.decode(
                model, sequences, device, blocks, warmup_tokens=warmup_tokens, label=name
            )
        report["runs"][name] = result["totals"]
    report["throughput_ratio_pool_vs_own_block"] = (
        report["runs"]["all-resident"]["tokens_per_second"] / base["totals"]["tokens_per_second"]
    )
    report["failures"] = failures(report)
    return report


def failures(report: dict) -> list[str]:
    base = report["base"]["nll"]
    found = []
    gap = abs(base - report["batched_nll"])
    if not gap <= BATCHED_TOLERANCE:  # written so that a NaN fails too
        found.append(
            f"teacher-forced NLL {base:.6f} vs batched {report['batched_nll']:.6f} "
            f"(|diff| {gap:.2e} > {BATCHED_TOLERANCE:.0e})"
        )
    for name, totals in report["runs"].items():
        gap = abs(totals["nll"] - base)
        if not gap <= POOL_TOLERANCE:
            found.append(
                f"{name} NLL {totals['nll']:.6f} vs base {base:.6f} "
                f"(|diff| {gap:.2e} > {POOL_TOLERANCE:.0e})"
            )
    return found


def check(report: dict) -> None:
    if report["failures"]:
        raise MoecacheError("exactness gate failed: " + "; ".join(report["failures"]))
