"""Router fine-tuning: the reward's simulated LRU, the tag, LoRA on the router, the merge,
the config's checks, and the stage's outputs in the smoke run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import moecache
from safetensors.torch import load_file

from moecache import config as configs
from moecache.errors import MoecacheError
from moecache.records.io import read_dict
from moecache.records.router_tuning import TuningLog
from moecache.router_tuning import prompts, reward, train

EXPERTS, TOP_K = 8, 2


def tiny_model(seed: int = 0):
    from transformers import OlmoeConfig, OlmoeForCausalLM

    torch.manual_seed(seed)
    config = OlmoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        max_position_embeddings=64,
        norm_topk_prob=False,
        tie_word_embeddings=False,
    )
    return OlmoeForCausalLM(config).eval()


def adapted(model, only=None):
    """The stage's LoRA adapters on `model`, their B factors made non-zero (all, or those
    whose name contains `only`): a trained adapter, without the training."""
    from peft import get_peft_model

    tuning = {"lora": {"r": 2, "alpha": 4}}
    peft_model = get_peft_model(model, train.lora_config(tuning, model))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name and (only is None or only in name):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    return peft_model


def top_k(model, x, layer=0):
    return reward.routing(model, [x[0].tolist()], [layer], "cpu")[layer][0]


def test_reward_is_one_when_every_expert_hits_and_less_on_misses():
    prompt = np.array([[0, 1], [2, 3], [4, 5]])
    hits = np.array([[0, 1], [3, 2], [5, 4], [1, 2]])  # all resident after the prompt
    misses = np.array([[6, 7], [0, 1], [6, 5], [7, 3]])
    streams = [np.concatenate([prompt, hits]), np.concatenate([prompt, misses])]
    rates = reward.hit_rates(streams, [3, 3], capacity=6, num_experts=EXPERTS)
    assert rates[0] == 1.0
    assert 0 < rates[1] < 1
    # 6, 7 evict 0, 1 (least recent), which then miss and evict 2, 3; 6, 5, 7 hit, 3
    # misses: 3 of 8 requests hit.
    assert rates[1] == pytest.approx(3 / 8)


def test_reward_counts_misses_the_cache_size_causes():
    stream = np.array([[0, 1], [2, 3], [0, 1], [2, 3]])
    small, large = (reward.hit_rates([stream], [1], c, EXPERTS)[0] for c in (2, 4))
    assert small == 0.0 and large == pytest.approx(4 / 6)


def test_harness_reward_counts_the_harness_split_of_copies():
    # One layer, capacity 2: the first token fills the pool; each later token copies 2.
    stream = np.array([[0, 1], [2, 3], [0, 1], [2, 3]])
    copies = reward.copies_per_token({0: [stream]}, capacity=2, num_experts=EXPERTS)
    assert copies.tolist() == [6 / 3]


def test_the_tag_is_read_back_and_its_absence_is_one_clear_error():
    assert prompts.tagged_size("<|endoftext|>" + prompts.tag(24) + " def f():") == 24
    with pytest.raises(MoecacheError, match="without a"):
        prompts.tagged_size("def f():")


class Tokens:
    """A tokenizer as the reward calls it: ids are the characters' codes, modulo 64."""

    def __call__(self, text):
        return {"input_ids": [[ord(c) % 64 for c in t] for t in text]}


def test_the_tagged_reward_simulates_the_size_each_prompt_names():
    settings = {
        "router_tuning": {"layer": 1, "capacity": 2},
        "harness": {"restricted_layers": [0, 1], "capacity": 4, "device": "cpu"},
        "model": {"architecture": {"num_experts": EXPERTS}},
    }
    scorer = reward.CacheReward("tag", Tokens(), settings)
    scorer.model = tiny_model()
    texts = [prompts.tag(2) + "abcdef", prompts.tag(8) + "abcdef"]
    completion = [[7, 9, 11, 13, 15, 17]] * 2
    logged = {}
    got = scorer(texts, ["", ""], completion, log_metric=logged.__setitem__)
    ids = Tokens()(texts)["input_ids"]
    routes = reward.routing(scorer.model, [[*p, *completion[0]] for p in ids], [1], "cpu")[1]
    want = [
        reward.hit_rates([routes[i]], [len(ids[i])], c, EXPERTS)[0] for i, c in ((0, 2), (1, 8))
    ]
    assert got == pytest.approx(want)
    assert got[1] == 1.0  # every expert fits: no miss after the prompt
    assert 0 <= logged["sim_hit_rate"] <= 1


def test_lora_reaches_router_experts_and_attention():
    names = {n for n, p in adapted(tiny_model()).named_parameters() if p.requires_grad}
    for part in ("mlp.gate.lora_A", "experts", "q_proj.lora_A", "o_proj.lora_B"):
        assert any(part in n for n in names), part


def test_lora_on_the_router_alone_changes_routing():
    x = torch.randint(0, 64, (1, 24), generator=torch.Generator().manual_seed(2))
    before = top_k(tiny_model(), x)
    after_router = top_k(adapted(tiny_model(), only="mlp.gate"), x)
    # At layer 0 only the router's adapter acts between the embedding and the routing
    # besides attention, whose adapters stay zero here.
    assert (np.sort(before, 1) != np.sort(after_router, 1)).any()


def test_merged_weights_give_the_adapter_models_logits():
    x = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(3))
    model = tiny_model()
    base = model(input_ids=x).logits
    peft_model = adapted(model)
    with torch.no_grad():
        want = peft_model(input_ids=x).logits
    merged, gap = train.merge(peft_model, x[0].tolist(), "cpu")
    assert (want - base).abs().max() > 1e-2  # the adapters matter
    assert gap < 1e-5
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=x).logits, want, atol=1e-5)
    assert not any("lora" in n for n, _ in merged.named_parameters())


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("layer", 0, "not one of harness.restricted_layers"),
        ("capacity", 2, "router_tuning.capacity: top-k 4 is larger than capacity 2"),
        ("cache_sizes", [4, 99], "router_tuning.cache_sizes: capacity 99 is larger than experts"),
        ("generation_prompts", 9, "more than measure_sequences"),
    ],
)
def test_bad_router_settings_are_one_clear_config_error(smoke_config, key, value, message):
    smoke_config["router_tuning"][key] = value
    with pytest.raises(configs.ConfigError, match=message):
        configs.check(smoke_config)


def test_an_unknown_variant_is_one_line_and_a_non_zero_exit(tmp_path):
    from conftest import SMOKE

    result = moecache(
        "router-train", "--config", str(SMOKE), "--variant", "bogus", "--model", "m",
        "--tokenizer", "t", "--text", "x.parquet", "--out-dir", str(tmp_path / "out"),
    )  # fmt: skip
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "moecache: error: variant 'bogus': one of sft, hit, tag, harness"
    ]


def test_smoke_run_fine_tunes_merges_and_fills_table3(smoke_run):
    root = smoke_run / "results" / "router_tuning"
    base = load_file(smoke_run / "results" / "model" / "model.safetensors")
    for variant in train.VARIANTS:
        folder = root / variant
        assert not list(folder.rglob("*.bin")) and not list(folder.rglob("*.pt"))
        merged = load_file(folder / "model" / "model.safetensors")
        assert set(merged) == set(base)  # adapters merged away
        log = read_dict(folder / "training.json", TuningLog)
        assert log["steps"] == 2 and log["merge_max_logit_gap"] < 1e-3
        if variant != "sft":
            assert log["log_sim_hit_rate"] is not None
            gate = "model.layers.1.mlp.gate.weight"
            assert not torch.equal(merged[gate], base[gate])  # the router moved
    table = (smoke_run / "figures" / "table3.md").read_text()
    assert "Not produced" not in table
    for row in ("Base (untuned)", "SFT control", "Cache-hit reward", "+ cache-size tag"):
        assert row in table
    assert "not comparable" in table
