"""Measurement in the harness, as the paper's Table 3: each model decodes teacher-forced text
under lossless LRU and lossless decayed-frequency eviction (the harness's pooled blocks,
interleaved arms), and its training setting (the trained layer alone at the trained
capacity) is the LRU run's recorded routing at that layer replayed through the same LRU
(lossless rules never change routing, so the replay is the harness's count).
"""

from __future__ import annotations

import numpy as np
import torch

from moecache.config import run_spec
from moecache.harness import decode
from moecache.model.memory import ring_mib
from moecache.router_tuning import reward


def arms_spec(tuning: dict) -> dict:
    return {
        "lru": run_spec("lru"),
        "decayed-frequency": run_spec("decayed-frequency", {"decay": tuning["decay"]}),
    }


def harness_counts(model, sequences: list[list[int]], settings: dict, starts=None) -> dict:
    """Steady copies under lossless LRU and decayed frequency at every restricted layer, the
    NLL, and at the trained layer and capacity: steady copies and the hit rate (tokens
    after the first); with `starts`, also the reward's hit rate (tokens from starts[i])."""
    harness, tuning = settings["harness"], settings["router_tuning"]
    arch = settings["model"]["architecture"]
    experts, top_k = arch["num_experts"], arch["num_experts_per_tok"]
    capacity, layers = harness["capacity"], harness["restricted_layers"]
    device = harness["device"]
    with decode.offloaded(
        model, layers, capacity, device, ring_mib(harness), slots=capacity * len(layers)
    ) as off:
        arms = [
            off.arm(name, decode.policy_factory(spec, capacity, experts, top_k), capacity)
            for name, spec in arms_spec(tuning).items()
        ]
        results = decode.decode(
            model, sequences, device, arms, off.own, harness["warmup_tokens"], 1, settings["seed"]
        )
    lru, freq = results["lru"]["totals"], results["decayed-frequency"]["totals"]
    streams = trained_layer(results["lru"]["trace"], tuning["layer"], len(sequences))
    counts, _ = reward.lru_counts(streams, tuning["capacity"], experts, keep=False)
    tokens = np.array([len(s) - 1 for s in streams])
    rates = reward.hit_rates(streams, [1] * len(streams), tuning["capacity"], experts)
    report = {
        "sequences": len(sequences),
        "tokens": int(sum(map(len, sequences))),
        "nll": lru["nll"],
        "scored_tokens": lru["scored_tokens"],
        "lru_steady": lru["steady_copies"],
        "lru_rho": lru["rho"],
        "decayed_frequency_steady": freq["steady_copies"],
        "decayed_frequency_nll": freq["nll"],
        "trained_layer_steady": int(counts.steady.sum()),
        "trained_layer_hit_rate": float((rates * tokens).sum() / tokens.sum()),
    }
    if starts is not None:
        simulated = reward.hit_rates(streams, starts, tuning["capacity"], experts)
        report["sim_hit_rate"] = float(simulated.mean())
    return report


def trained_layer(trace: list[dict], layer: int, sequences: int) -> list[np.ndarray]:
    """Per sequence, the requested experts [T, k] the harness recorded at `layer`."""
    rows = [[] for _ in range(sequences)]
    for step in sorted(
        (s for s in trace if s["layer"] == layer), key=lambda s: (s["sequence"], s["token"])
    ):
        rows[step["sequence"]].append(list(step["requested"]))
    return [np.asarray(r, dtype=np.int64) for r in rows]


@torch.inference_mode()
def generate(model, prompts: list[list[int]], new_tokens: int, pad_id: int, device: str):
    """Greedy continuations, prompt included, one prompt at a time (no padding)."""
    out = []
    for ids in prompts:
        x = torch.tensor([ids], device=device)
        full = model.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad_id,
        )
        out.append(full[0].tolist())
    return out
