"""DeepSeek-V2/V3 routing through their adapters, on tiny models (tiny.py): the controller's
training block routes as the model does (scaling, group-limited top-k) and as the harness
restricts; restricted group choice counts only the allowed experts and keeps Dwell-1's gate
exact; the requests come most probable first; and the plan counts MLA's KV cache as
transformers' cache holds it."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY_ARCH

from moecache.controller.mixture import ControlledBlock
from moecache.controller.train import new_heads
from moecache.model import registry, routing, tiny
from moecache.schedule import accountant

ARCH = TINY_ARCH
N, K, LAYER, VOCAB = ARCH["num_experts"], ARCH["num_experts_per_tok"], 1, 64
# The full DeepSeek-V2's routing at tiny sizes: group-limited, scaled (V2-Lite is greedy, 1.0).
GROUPED_V2 = {
    "topk_method": "group_limited_greedy",
    "n_group": 4,
    "topk_group": 2,
    "routed_scaling_factor": 1.7,
}
MODELS = {
    "deepseek_v2": {},
    "deepseek_v2 grouped": GROUPED_V2,
    "deepseek_v3": {},  # tiny.py's V3: 4 groups, best 2 kept, scaling 2.5, biased choice
}


def model(name: str):
    return tiny.model(name.split()[0], ARCH, VOCAB, seed=0, **MODELS[name])


def hidden(tokens: int, seed: int = 3) -> torch.Tensor:
    return torch.randn(tokens, ARCH["hidden_size"], generator=torch.Generator().manual_seed(seed))


def random_sets(tokens: int, size: int, seed: int = 4) -> torch.Tensor:
    """[T, N] bool: a random set of `size` experts per token."""
    generator = torch.Generator().manual_seed(seed)
    allowed = torch.zeros(tokens, N, dtype=torch.bool)
    for t in range(tokens):
        allowed[t, torch.randperm(N, generator=generator)[:size]] = True
    return allowed


# --- the controller's training block --------------------------------------------------------


def controlled(own_model, capacity: int, mode: str = "sampled"):
    adapter = registry.of(own_model)
    own = adapter.block(own_model, LAYER)
    heads = new_heads(own_model, [LAYER])
    return own, ControlledBlock(own, adapter, heads, LAYER, capacity, mode, temperature=0.1)


def test_the_controllers_block_is_the_models_own_when_nothing_is_restricted():
    """Sampled at C = N the cache holds every expert: the block must be the model's own,
    routed_scaling_factor and the group limit included."""
    own, block = controlled(model("deepseek_v2 grouped"), capacity=N)
    x = hidden(12).view(2, 6, -1)
    with torch.no_grad():
        torch.testing.assert_close(block(x), own(x))


def test_the_controllers_block_restricts_as_the_harness(monkeypatch):
    """With a 0/1 cache (the sampled objective's) the block computes the adapter's restricted
    routing among the cached experts, as the pooled block does."""
    from moecache.controller import mixture

    own_model = model("deepseek_v2 grouped")
    own, block = controlled(own_model, capacity=2 * K)
    adapter = registry.of(own_model)
    x = hidden(12)
    cached = random_sets(12, 2 * K)
    real = mixture.sampled_cache

    def fixed(beta, scores, capacity):
        _, stats = real(beta, scores, capacity)
        return cached.view(1, 12, N).float(), stats

    monkeypatch.setattr(mixture, "sampled_cache", fixed)
    with torch.no_grad():
        got = block(x.view(1, 12, -1)).view(12, -1)
        logits, _, _ = adapter.route(own, x)
        weights, index = adapter.restrict(own, logits, cached)
        expected = adapter.experts(own)(x, index, weights) + adapter.shared(own, x)
    torch.testing.assert_close(got, expected)


def test_the_controllers_soft_cache_trains_through_the_group_limited_routing():
    own, block = controlled(model("deepseek_v2 grouped"), capacity=2 * K, mode="soft")
    out = block(hidden(12).view(2, 6, -1))
    out.square().mean().backward()
    grads = [block.heads.mu[str(LAYER)].weight.grad, block.heads.beta[str(LAYER)].weight.grad]
    assert all(g is not None and g.isfinite().all() and g.abs().sum() > 0 for g in grads)


def test_deepseek_v3_refuses_the_controllers_block_in_one_line():
    from moecache.errors import MoecacheError

    with pytest.raises(MoecacheError, match="the deepseek_v3 family cannot run it: the contr"):
        controlled(model("deepseek_v3"), capacity=N)


# --- restricted group choice -----------------------------------------------------------------


def best_groups(scores, members, group_score, topk_group) -> list[int]:
    """The `topk_group` groups (of 4) ranked best by `group_score` of their `members`'
    scores, best first."""
    size = N // 4
    by_group = {
        g: sorted((float(scores[e]) for e in members if e // size == g), reverse=True)
        or [-math.inf]
        for g in range(4)
    }
    return sorted(range(4), key=lambda g: -group_score(by_group[g]))[:topk_group]


def expected_choice(scores, allowed, group_score, topk_group, own_groups_first=False):
    """One token's restricted choice, written out: the top k allowed experts of the best
    `topk_group` groups ranked over the allowed experts (or of all allowed experts where
    those hold fewer than k); with `own_groups_first`, of the model's own groups where they
    hold k allowed experts."""
    ids = [e for e in range(N) if allowed[e]]
    best = best_groups(scores, ids, group_score, topk_group)
    pools = [[e for e in ids if e // (N // 4) in best], ids]
    if own_groups_first:
        own = best_groups(scores, range(N), group_score, topk_group)
        pools.insert(0, [e for e in ids if e // (N // 4) in own])
    pool = next(pool for pool in pools if len(pool) >= K)
    return sorted(sorted(pool, key=lambda e: -float(scores[e]))[:K])


def test_restricted_group_choice_counts_only_allowed_experts_deepseek_v2():
    """At C = 2k every token gets k allowed experts of the best allowed groups at their
    model weights, never a zero-weight filler while allowed experts remain."""
    own_model = model("deepseek_v2 grouped")
    adapter = registry.of(own_model)
    own = adapter.block(own_model, LAYER)
    x, allowed = hidden(200), random_sets(200, 2 * K)
    with torch.no_grad():
        logits, _, _ = adapter.route(own, x)
        weights, index = adapter.restrict(own, logits, allowed)
    probs = logits.softmax(-1)
    assert allowed.gather(1, index).all()
    assert (weights > 0).all(), f"{int((weights == 0).any(-1).sum())} tokens with zero weights"
    for t in range(len(x)):
        assert sorted(index[t].tolist()) == expected_choice(probs[t], allowed[t], max, 2)
    torch.testing.assert_close(weights, probs.gather(1, index) * 1.7)


def test_restricted_group_choice_counts_only_allowed_experts_deepseek_v3():
    """V3 keeps the model's own groups where they hold k allowed experts (its group score
    reads experts that need not be resident); else its groups are ranked by the sum of
    their two best allowed experts' biased scores (one where a group holds one)."""
    own_model = model("deepseek_v3")
    adapter = registry.of(own_model)
    own = adapter.block(own_model, LAYER)
    router = adapter.router(own)
    x, allowed = hidden(200), random_sets(200, 2 * K)
    with torch.no_grad():
        logits, _, _ = adapter.route(own, x)
        weights, index = adapter.restrict(own, logits, allowed)
    scores = logits.sigmoid()
    choice = scores + router.e_score_correction_bias

    def two_best(values):
        return sum(values[:2])

    assert allowed.gather(1, index).all()
    for t in range(len(x)):
        expected = expected_choice(choice[t], allowed[t], two_best, 2, own_groups_first=True)
        assert sorted(index[t].tolist()) == expected
    picked = scores.gather(1, index)
    torch.testing.assert_close(weights, picked / picked.sum(-1, keepdim=True) * 2.5)


@pytest.mark.parametrize("others", [0, K])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_resident_set_holding_the_request_gives_it_back(name, others):
    """Dwell-1's gate: restricted to a set holding the model's own choice (and `others`
    experts besides), the choice and its weights."""
    own_model = model(name)
    adapter = registry.of(own_model)
    own = adapter.block(own_model, LAYER)
    x = hidden(256)
    with torch.no_grad():
        logits, request_weights, request = adapter.route(own, x)
        allowed = random_sets(len(x), others).scatter(1, request, True)
        weights, index = adapter.restrict(own, logits, allowed)
    assert index.tolist() == request.tolist()
    torch.testing.assert_close(weights, request_weights, rtol=1e-6, atol=1e-7)


# --- requests most probable first ------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MODELS))
def test_requests_come_most_probable_first_and_compute_the_same(name):
    """Reordered, the block's output is the same (transformers' eager experts sum each
    token's experts in expert order, whatever the order of its top-k): to the bit with one
    thread; torch's thread pool may split a matmul's reduction otherwise, hence float32's
    default tolerance."""
    own_model = model(name)
    own_model.config._experts_implementation = "eager"
    adapter = registry.of(own_model)
    own = adapter.block(own_model, LAYER)
    x = hidden(64)
    with torch.no_grad(), routing.recorded(own_model, [LAYER]) as recorded:
        _, weights, index = adapter.route(own, x)
        out = adapter.experts(own)(x, index, weights) + adapter.shared(own, x)
        own_out = own(x.view(1, 64, -1)).view(64, -1)
    assert (weights[:, :-1] >= weights[:, 1:]).all()
    assert recorded[LAYER][1].tolist() == index.tolist()
    torch.testing.assert_close(out, own_out)


# --- the KV cache the plan counts ------------------------------------------------------------


@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3", "olmoe", "qwen3_moe"])
def test_the_plan_counts_the_kv_cache_transformers_holds(family):
    from transformers import DynamicCache

    own_model = tiny.model(family, ARCH, VOCAB, seed=0)
    tokens = 9
    cache = DynamicCache(config=own_model.config)
    with torch.no_grad():
        own_model(input_ids=torch.arange(tokens)[None], cache=cache, use_cache=True)
    held = sum(
        tensor.numel() * tensor.element_size()
        for layer in cache.layers
        for tensor in (layer.keys, layer.values)
    )
    assert held == accountant.kv_bytes_per_token(own_model.config, element=4) * tokens
