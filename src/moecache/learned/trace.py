"""The training trace: the routing of sequences from the training part of the corpus, in
the harness's trace format.

A lossless rule never changes routing, so the demand and router probabilities an LRU run
records are the unmodified model's, token by token. They are recorded here in one
teacher-forced pass per sequence through the model's own blocks, from the router's own
output (`mlp.gate` returns logits, top-k weights and top-k ids, in the order the pooled
block reads them); tests/test_learned.py checks the result against a harness trace.
"""

from __future__ import annotations

import numpy as np
import torch


def record(model, sequences: list[list[int]], layers: list[int], device: str) -> list[dict]:
    """Trace rows (sequence, layer, token, requested, used, probs) as harness.trace.write
    takes them."""
    captured: dict[int, tuple] = {}

    def hook(layer):
        def keep(module, inputs, output):
            logits, _, top_index = output
            probs = torch.softmax(logits, dtype=torch.float, dim=-1)
            captured[layer] = (probs.cpu().numpy(), top_index.cpu().numpy())

        return keep

    blocks = model.model.layers
    handles = [blocks[layer].mlp.gate.register_forward_hook(hook(layer)) for layer in layers]
    rows = []
    try:
        with torch.no_grad():
            for seq, ids in enumerate(sequences):
                model(input_ids=torch.tensor([ids], device=device))
                for layer in layers:
                    probs, top = captured[layer]
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
    finally:
        for handle in handles:
            handle.remove()
    return rows
