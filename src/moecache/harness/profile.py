"""What one expert copy and one token's compute cost on this machine, and whether the
trained router has token-to-token structure (the property every cache result rests on)."""

from __future__ import annotations

import numpy as np
import torch

from moecache.harness.nll import next_token_nll_sum
from moecache.harness.timing import Stopwatch
from moecache.model import registry
from moecache.model import routing as routing_of


@torch.inference_mode()
def token_seconds(model, sequences: list[list[int]], device: str) -> list[float]:
    """Per-token decode times with the KV cache, batch 1; each sequence's first token and
    a warm-up sequence are left out."""
    from transformers import DynamicCache

    watch, times = Stopwatch(device), []
    for n, ids in enumerate([sequences[0], *sequences]):
        cache = DynamicCache(config=model.config)
        x = torch.tensor([ids], device=device)
        for t in range(x.shape[1]):
            watch.start()
            model(input_ids=x[:, t : t + 1], cache=cache, use_cache=True)
            seconds = watch.stop()
            if n > 0 and t > 0:
                times.append(seconds)
    return times


@torch.inference_mode()
def routing(model, sequences: list[list[int]], device: str, seed: int) -> dict:
    """Held-out NLL, and the share of a token's experts the previous token also used,
    against the same share after shuffling token order (same experts, no temporal order)."""
    adapter = registry.of(model)
    rng = np.random.default_rng(seed)
    nll_sum, scored = 0.0, 0
    reuse, shuffled = [], []
    for ids in sequences:
        x = torch.tensor([ids], device=device)
        with routing_of.recorded(model) as captured:
            out = model(input_ids=x)
        # From the logits: the model's own loss would add the load-balancing term.
        nll_sum += next_token_nll_sum(out.logits, x)
        scored += len(ids) - 1
        layers = [index.cpu().numpy() for _, (_, index) in sorted(captured.items())]
        k = adapter.sizes(model.config).num_experts_per_tok
        reuse.append([overlap(chosen, k) for chosen in layers])
        shuffled.append([overlap(chosen[rng.permutation(len(chosen))], k) for chosen in layers])
    return {
        "heldout_nll": nll_sum / scored,
        "reuse_per_layer": np.mean(reuse, axis=0).tolist(),
        "reuse_shuffled_per_layer": np.mean(shuffled, axis=0).tolist(),
    }


def overlap(chosen: np.ndarray, k: int) -> float:
    """Mean |S_t & S_(t-1)| / k over a sequence's tokens."""
    pairs = zip(chosen[1:], chosen[:-1], strict=True)
    return float(np.mean([len(set(now) & set(before)) / k for now, before in pairs]))
