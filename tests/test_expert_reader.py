"""The routed experts read straight from the checkpoint's files
(model/expert_reader.py): in every family the model comes out as transformers loads it,
weight for weight, from one file or shards, in the stored dtype or cast; the load holds
the experts once (no pair's stacks, no second mapping of the files), as the plan says; a
checkpoint that lacks an expert tensor, or another weight, is refused in one line."""

from __future__ import annotations

import gc

import pytest
import torch
from conftest import TINY_ARCH
from safetensors.torch import load_file, save_file

from moecache.errors import MoecacheError
from moecache.model import checkpoint, expert_reader, registry, tiny
from moecache.model.memory import host_census

ARCH = TINY_ARCH | {"num_experts": 8, "num_experts_per_tok": 2}
TOKENS = torch.tensor([[1, 2, 3, 4, 5]])


def saved(family: str, folder, dtype=torch.float32, **save) -> None:
    """A tiny checkpoint of `family` in the hub's layout."""
    tiny.model(family, ARCH, 64, seed=0).to(dtype).save_pretrained(folder, **save)


def transformers_own(folder, dtype: str):
    """The checkpoint as transformers alone loads it (its experts fused by it)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=checkpoint.DTYPES[dtype]).eval()


def same_weights(a, b) -> bool:
    one, two = a.state_dict(), b.state_dict()
    return one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)


@pytest.mark.parametrize("family", sorted(registry.ADAPTERS))
def test_the_read_experts_are_transformers_own_in_every_family(family, tmp_path):
    saved(family, tmp_path)
    plain = transformers_own(tmp_path, "float32")
    read = checkpoint.load(tmp_path, "float32", "cpu", ARCH)
    assert same_weights(plain, read)
    for (name, one), (_, two) in zip(plain.named_buffers(), read.named_buffers(), strict=True):
        assert torch.equal(one, two), name  # nothing left uninitialised
    assert torch.equal(plain(TOKENS).logits, read(TOKENS).logits)
    # Saved, it writes the checkpoint's own names again (what peft's merged routers do).
    read.save_pretrained(tmp_path / "again")
    assert load_file(tmp_path / "again" / "model.safetensors").keys() == (
        load_file(tmp_path / "model.safetensors").keys()
    )


def test_a_read_load_leaves_the_random_state_as_transformers_own_load_does(tmp_path):
    """A seed set before the load draws the same after it (the controller seeds its heads
    before loading the model: a reader that drew would move every published heads file)."""
    saved("olmoe", tmp_path)
    assert expert_reader.reads(checkpoint.read_config(tmp_path))
    torch.manual_seed(0)
    transformers_own(tmp_path, "float32")
    after_theirs = torch.rand(4)
    torch.manual_seed(0)
    checkpoint.load(tmp_path, "float32", "cpu", ARCH)
    assert torch.equal(torch.rand(4), after_theirs)


@pytest.mark.parametrize("family", ["mixtral", "olmoe"])
def test_shards_and_a_cast_read_the_same_weights(family, tmp_path):
    """Experts spread over shards; a bfloat16 checkpoint read as float32 (a chunk at a time)."""
    sharded, half = tmp_path / "sharded", tmp_path / "half"
    saved(family, sharded, max_shard_size="20KB")
    assert len(list(sharded.glob("*.safetensors"))) > 2
    saved(family, half, dtype=torch.bfloat16)
    for folder, dtype in ((sharded, "float32"), (half, "float32"), (half, "bfloat16")):
        plain = transformers_own(folder, dtype)
        read = checkpoint.load(folder, dtype, "cpu", ARCH)
        assert same_weights(plain, read), (folder.name, dtype)


@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
def test_the_load_holds_the_read_experts_once_as_the_plan_sizes_it(stored, tmp_path):
    """transformers fuses an expert layer with its pair's stacks beside the result; read,
    every layer is allocated once and filled in place (a bfloat16 checkpoint loaded as
    float32 through one chunk): the census's peak is the plan's."""
    arch = ARCH | {"hidden_size": 256, "intermediate_size": 512, "num_experts": 16}
    model = tiny.model("olmoe", arch, 64, seed=0).to(stored)
    model.save_pretrained(tmp_path)
    params = [
        {n: p.numel() * 4 for n, p in layer.mlp.experts.named_parameters()}
        for layer in model.model.layers
    ]
    rest = sum(p.numel() * 4 for p in model.parameters()) - sum(map(sum, map(dict.values, params)))
    del model
    chunk = expert_reader.READ_CHUNK_BYTES if stored != torch.float32 else 0
    # Cast as it is read, each tensor is a new one: the mapped files are let go (plan.loading).
    files = rest if chunk else checkpoint.file_bytes(tmp_path)
    gc.collect()
    with host_census() as counted:
        checkpoint.load(tmp_path, "float32", "cpu", arch)
    planned = checkpoint.load_host_peak(files, params, "olmoe", True, chunk)
    assert counted["peak"] <= planned["host_load_peak_bytes"]
    assert planned["host_load_peak_bytes"] <= counted["peak"] + checkpoint.SMALL_TENSOR_BYTES
    assert planned["read_experts_bytes"] == sum(map(sum, map(dict.values, params)))
    assert planned["fused_experts_bytes"] == planned["fusing_stacks_bytes"] == 0
    # transformers' own fusing, as it would have been: a pair's stacks above it.
    fused = checkpoint.load_host_peak(files, params, "olmoe", False, chunk)
    assert fused["host_load_peak_bytes"] > planned["host_load_peak_bytes"]


def test_only_experts_transformers_would_fuse_are_read():
    """GPT-OSS stores its experts fused: transformers keeps them as views of the mapped
    files, nothing to save; a quantized checkpoint's are kept as stored (quantized.py)."""
    assert expert_reader.reads(tiny.config("olmoe", ARCH, 64))
    assert expert_reader.reads(tiny.config("mixtral", ARCH, 64))
    assert not expert_reader.reads(tiny.config("gpt_oss", ARCH, 64))
    fp8 = tiny.config("qwen3_moe", ARCH, 64)
    fp8.quantization_config = {"quant_method": "fp8", "weight_block_size": [8, 8]}
    assert not expert_reader.reads(fp8)


def saved_without(folder, key: str) -> None:
    """A tiny OLMoE checkpoint with tensor `key` taken out of its file."""
    saved("olmoe", folder)
    file = next(folder.glob("*.safetensors"))
    tensors = load_file(file)
    del tensors[key]
    save_file(tensors, file, metadata={"format": "pt"})


def test_a_checkpoint_short_of_an_expert_is_refused_in_one_line(tmp_path):
    saved_without(tmp_path, "model.layers.1.mlp.experts.3.up_proj.weight")
    with pytest.raises(MoecacheError) as refused:
        checkpoint.load(tmp_path, "float32", "cpu", ARCH)
    assert "layer 1's experts lack gate_up_proj" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_another_missing_weight_is_refused_not_left_uninitialised(tmp_path):
    saved_without(tmp_path, "model.layers.0.self_attn.q_proj.weight")
    with pytest.raises(MoecacheError, match="lacks 1 weights"):
        checkpoint.load(tmp_path, "float32", "cpu", ARCH)


def test_the_skipped_keys_are_each_layers_routed_experts_only():
    import re

    pattern = re.compile(expert_reader.layer_keys(1))
    assert pattern.search("model.layers.1.mlp.experts.0.gate_proj.weight")
    assert pattern.search("model.layers.1.block_sparse_moe.experts.7.w1.weight")
    assert not pattern.search("model.layers.11.mlp.experts.0.gate_proj.weight")
    assert not pattern.search("model.layers.1.mlp.shared_experts.gate_proj.weight")
    assert not pattern.search("model.layers.1.mlp.gate.weight")
