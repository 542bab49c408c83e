"""The training trace: the routing of sequences from the training part of the corpus, in
the harness's trace format.

A lossless rule never changes routing, so the demand and router probabilities an LRU run
records are the unmodified model's, token by token. They are recorded here in one
teacher-forced pass per sequence through the model's own blocks, from the router's own
output (every family's router returns logits, top-k weights and top-k ids:
model/routing.py); tests/test_learned.py checks the result against a harness trace.
"""

from __future__ import annotations

import numpy as np
import torch

from moecache.model import registry, routing


def record(model, sequences: list[list[int]], layers: list[int], device: str) -> list[dict]:
    """Trace rows (sequence, layer, token, requested, used, probs) as records.trace.write
    takes them."""
    adapter = registry.of(model)
    rows = []
    with torch.no_grad(), routing.recorded(model, layers) as captured:
        for seq, ids in enumerate(sequences):
            model(input_ids=torch.tensor([ids], device=device))
            for layer in layers:
                logits, top = captured[layer]
                probs = adapter.probabilities(logits).cpu().numpy()
                top = top.cpu().numpy()
                for t in range(len(ids)):
                    request = top[t].astype(np.int64).tolist()
                    rows.append(
                        {
                            "sequence": seq,
                            "layer": layer,
                            "token": t,
                            "requested": request,
                            "used": request,
                            "probs": probs[t],
                        }
                    )
    return rows
