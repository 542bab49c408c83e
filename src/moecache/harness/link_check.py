"""Which slower link prices copies and nothing else: LRU decoded at 1x and at the largest
copy multiplier under every link kind the device allows, interleaved sequence by sequence.

A link m times slower makes copies dearer and leaves the compute alone, so a scaled run's
compute per token (step time less copy time) should equal the 1x run's, and its time per
copy should be m times the 1x one. On a CPU the link kinds differ in exactly that
(link.py); this job measures it on the machine at hand, so that the README's choice of
`auto` stands on numbers from the same run.
"""

from __future__ import annotations

import torch

from moecache.config import run_spec
from moecache.errors import MoecacheError
from moecache.harness import decode, link

KINDS_ON = {"cpu": ("charge", "hold", "ring"), "cuda": ("ring",)}


def run(model, sequences, harness: dict, arch: dict, ring_mib: int, seed: int = 0) -> dict:
    device, capacity = harness["device"], harness["capacity"]
    m = max(link.multipliers(harness))
    if m == 1:
        raise MoecacheError("link check: no run of harness.runs has a multiplier above 1")
    kinds = KINDS_ON[torch.device(device).type]
    make = decode.policy_factory(
        run_spec("lru"), capacity, arch["num_experts"], arch["num_experts_per_tok"]
    )
    layers = harness["restricted_layers"]
    with decode.offloaded(model, layers, capacity, device, ring_mib, link=kinds[0]) as off:
        arms = [off.arm("1x", make, capacity)]
        for kind in kinds:
            slow = off.link if kind == off.link.kind else off.new_link(kind)
            arms.append(off.arm(f"{kind} {m}x", make, capacity, m, link=slow))
        results = decode.decode(
            model, sequences, device, arms, off.own, harness["warmup_tokens"], 1, seed
        )
    one = results["1x"]["totals"]
    rows = []
    for arm, kind in zip(arms, (None, *kinds), strict=True):
        t = results[arm.name]["totals"]
        rows.append(
            {
                "run": arm.name,
                "link": kind,
                "multiplier": arm.multiplier,
                "compute_ms": t["compute_ms"],
                "compute_ms_ci": t["compute_ms_ci"],
                "compute_ratio_to_1x": t["compute_ms"] / one["compute_ms"],
                "tau_ms": t["tau_ms"],
                "tau_ratio_to_1x": t["tau_ms"] / one["tau_ms"],
                "step_ms": t["step_ms"],
                "copies_per_token": t["copies_per_token"],
            }
        )
    return {
        "policy": "lru",
        "capacity": capacity,
        "multiplier": m,
        "sequences": len(sequences),
        "timed_tokens": one["timed_tokens"],
        "runs": rows,
    }
