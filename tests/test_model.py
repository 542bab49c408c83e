"""The embedded model is transformers' real OLMoE; one loader serves it and any local OLMoE
checkpoint; training is seeded and reproducible."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM, OlmoeForCausalLM
from transformers.models.olmoe.modeling_olmoe import OlmoeExperts, OlmoeTopKRouter

from moecache.data import corpus, tokenizer
from moecache.errors import MoecacheError
from moecache.model import checkpoint, train


@pytest.fixture(scope="module")
def texts():
    docs = [d["text"] for d in corpus.python_docs() if len(d["text"]) >= 600]
    return docs[:40]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory, texts):
    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    tokenizer.train(texts, 400, out)
    return out


def tiny_settings(smoke_config, seed=0, steps=3):
    smoke_config["seed"] = seed
    smoke_config["training"]["steps"] = steps
    return smoke_config


def test_tokenizer_round_trips_and_marks_documents(tok_dir, texts):
    tok = tokenizer.load(tok_dir)
    assert len(tok) == 400
    ids = tokenizer.document_ids(tok, texts[0])
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids[1:]) == texts[0]


def test_embedded_config_is_olmoe(tok_dir, smoke_config):
    arch = smoke_config["model"]["architecture"]
    config = checkpoint.embedded_config(arch, tokenizer.load(tok_dir), 0.01)
    model = OlmoeForCausalLM(config)
    mlp = model.model.layers[0].mlp
    assert isinstance(mlp.gate, OlmoeTopKRouter) and isinstance(mlp.experts, OlmoeExperts)
    e, h, i = arch["num_experts"], arch["hidden_size"], arch["intermediate_size"]
    assert mlp.experts.gate_up_proj.shape == (e, 2 * i, h)
    assert mlp.experts.down_proj.shape == (e, h, i)
    assert mlp.gate.top_k == arch["num_experts_per_tok"] and not config.norm_topk_prob


@pytest.mark.parametrize("threads", [1, 2])
def test_training_is_reproducible(tmp_path, tok_dir, texts, smoke_config, threads):
    # Two threads and a larger batch: the setting in which MoE gradients once summed in
    # thread order and two runs of the same seed parted after a few steps.
    smoke_config["training"].update(threads=threads, batch_size=16, seq_len=64)
    for name, seed in [("a", 0), ("b", 0), ("c", 1)]:
        train.train(tiny_settings(smoke_config, seed, steps=6), tok_dir, texts, tmp_path / name)
    a, b, c = (load_file(tmp_path / n / "model.safetensors") for n in "abc")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_loader_reads_a_local_olmoe_directory(tmp_path, tok_dir, texts, smoke_config):
    settings = tiny_settings(smoke_config, steps=1)
    train.train(settings, tok_dir, texts, tmp_path / "m")
    arch = settings["model"]["architecture"]
    model = checkpoint.load(tmp_path / "m", "float32", "cpu", arch)
    # Saved as the hub checkpoints are, one tensor per expert and projection; loading fuses
    # them into transformers 5's gate_up_proj [E, 2I, H] and down_proj [E, H, I].
    saved = load_file(tmp_path / "m" / "model.safetensors")
    experts = model.model.layers[1].mlp.experts
    for e in range(arch["num_experts"]):
        prefix = f"model.layers.1.mlp.experts.{e}"
        gate, up = saved[f"{prefix}.gate_proj.weight"], saved[f"{prefix}.up_proj.weight"]
        gate_up = torch.cat([gate, up])
        assert torch.equal(experts.gate_up_proj[e], gate_up)
        assert torch.equal(experts.down_proj[e], saved[f"{prefix}.down_proj.weight"])
    wrong = {**arch, "num_experts": 32}
    with pytest.raises(MoecacheError, match="model.architecture.num_experts: config says 32"):
        checkpoint.load(tmp_path / "m", "float32", "cpu", wrong)


def test_loader_refuses_a_family_without_an_adapter(tmp_path, smoke_config):
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
        )
    )
    llama.save_pretrained(tmp_path / "llama")
    arch = smoke_config["model"]["architecture"]
    with pytest.raises(MoecacheError, match="'llama' has no adapter; families with one: deepseek"):
        checkpoint.load(tmp_path / "llama", "float32", "cpu", arch)
    with pytest.raises(MoecacheError, match="cannot load"):
        checkpoint.load(tmp_path / "missing", "float32", "cpu", arch)
