"""The routing a model computes, recorded from its own routers' outputs through forward
hooks: (logits, top-k ids) per sparse layer, for any family (every router returns logits,
top-k weights and top-k ids), the ids most probable first as the adapter's `route` gives
them (DeepSeek's routers leave their top-k unsorted)."""

from __future__ import annotations

import contextlib

import torch

from moecache.model import registry


@contextlib.contextmanager
def recorded(model, layers=None):
    """Yields a dict layer -> (logits [T, N], top-k ids [T, k]) of the latest forward,
    for `layers` (default: every sparse layer)."""
    adapter = registry.of(model)
    layers = adapter.sizes(model.config).moe_layers if layers is None else layers
    captured: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def hook(layer):
        def keep(module, inputs, output):
            logits, top_weights, top_index = output[:3]
            _, top_index = adapter.most_probable_first(top_weights, top_index)
            captured[layer] = (logits.detach(), top_index.detach())

        return keep

    handles = [
        adapter.layer_router(model, layer).register_forward_hook(hook(layer)) for layer in layers
    ]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()
