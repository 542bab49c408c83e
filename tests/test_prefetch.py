"""The prefetchers on their own, over stand-in blocks: what each asks for, for which block
and up to which token, and the registry's refusals."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from moecache import prefetch
from moecache.errors import MoecacheError

# Recorded demand per layer: token t of layer 1 requests [t, t+1], of layer 2 [t+4, t+5].
FUTURE = {1: [[t, t + 1] for t in range(5)], 2: [[t + 4, t + 5] for t in range(5)]}


def linked(layers=(1, 2)):
    blocks = [SimpleNamespace(layer=layer, future=FUTURE[layer]) for layer in layers]
    for here, after in zip(blocks, blocks[1:] + blocks[:1], strict=True):
        here.following = after
    return blocks


def test_none_asks_for_nothing():
    first, _ = linked()
    assert prefetch.make("none").want(first, 0, None) is None


def test_oracle_fetches_the_next_layers_demand_at_the_same_token():
    first, second = linked()
    want = prefetch.make("oracle").want(first, 2, None)
    assert (want.block, want.deadline, want.experts) == (second, 2, [6, 7])


def test_oracle_after_the_last_layer_fetches_the_first_layers_next_token():
    first, second = linked()
    want = prefetch.make("oracle").want(second, 2, None)
    assert (want.block, want.deadline, want.experts) == (first, 3, [3, 4])
    assert prefetch.make("oracle").want(second, 4, None) is None  # past the sequence


def test_lookahead_fetches_its_layers_next_k_tokens_soonest_first():
    first, _ = linked()
    want = prefetch.make("lookahead", {"k": 2}).want(first, 1, None)
    assert (want.block, want.deadline, want.experts) == (first, 3, [2, 3, 4])
    near_end = prefetch.make("lookahead", {"k": 3}).want(first, 3, None)
    assert (near_end.deadline, near_end.experts) == (4, [4, 5])


def test_pregate_applies_the_next_layers_own_router_to_the_hidden_state():
    hidden = torch.randn(1, 6)
    router = torch.nn.Linear(6, 8, bias=False)

    def route(module, x):  # an adapter's route(): logits, top weights, top ids
        logits = module(x)
        weights, ids = logits.topk(2)
        return logits, weights, ids

    first, second = linked()
    second.own, second.adapter = router, SimpleNamespace(route=route)
    want = prefetch.make("pregate").want(first, 1, hidden)
    assert (want.block, want.deadline) == (second, 1)
    assert want.experts == router(hidden).topk(2).indices[0].tolist()
    # After the last layer, the next token's hidden state does not exist yet.
    assert prefetch.make("pregate").want(second, 1, hidden) is None


def test_the_registry_refuses_bad_names_and_parameters():
    with pytest.raises(MoecacheError, match="not one of none, pregate, oracle, lookahead"):
        prefetch.make("psychic")
    with pytest.raises(MoecacheError, match="unknown parameter"):
        prefetch.make("oracle", {"k": 2})
    with pytest.raises(MoecacheError, match="must be >= 1"):
        prefetch.make("lookahead", {"k": 0})
    assert {name for name, cls in prefetch.PREFETCHERS.items() if cls.needs_trace} == {
        "oracle",
        "lookahead",
    }
