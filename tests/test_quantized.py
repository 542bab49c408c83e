"""Quantized hub experts kept as stored (model/quantized.py): tiny checkpoints of GPT-OSS
(MXFP4) and of DeepSeek-V3 and Qwen3-MoE (FP8, 128 x 128 block scales), written offline in
the hub's on-disk layout (model/tiny_quantized.py) and loaded through the pipeline's loader.
The reference is transformers' own dequantized load of the same checkpoint
(`Mxfp4Config(dequantize=True)`, `FineGrainedFP8Config(dequantize=True)`).

Exactness: each stored expert dequantizes to transformers' dequantized weights bit for bit,
in float32 and bfloat16 (both dequantize in float32 and cast, and MXFP4's values are exact in
either); so the pooled block over the stored experts and transformers' block multiply the
same weights and differ only in the order the k experts' outputs are summed (float32
rounding, rtol 1e-5), and the NLL of the pooled runs equals transformers' batched NLL within
the gates' own tolerance between token-by-token and batched evaluation (4e-4)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_HARNESS
from safetensors import safe_open

from moecache.errors import MoecacheError
from moecache.harness import decode, gates, nll, placement
from moecache.model import checkpoint, quantized, registry, tiny, tiny_quantized
from moecache.schedule import accountant

sys.path.insert(0, str(Path(__file__).parent / "rehearsal"))
import build as rehearsal  # noqa: E402

from moecache.config import run_spec

REPO = Path(__file__).parents[1]
BASE = {
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 64,
}
# MXFP4 scales 32 inputs; FP8 scales 128 x 128 blocks, so both sizes span several of each.
CASES = {
    "gpt_oss": ("mxfp4", {**BASE, "hidden_size": 64, "intermediate_size": 64}),
    "deepseek_v3": ("fp8", {**BASE, "hidden_size": 256, "intermediate_size": 256}),
    "qwen3_moe": ("fp8", {**BASE, "hidden_size": 256, "intermediate_size": 128}),
}
LAYERS, CAPACITY = [1, 2], 4
HARNESS = {**TINY_HARNESS, "restricted_layers": LAYERS, "capacity": CAPACITY}


@pytest.fixture(scope="module")
def tokenizer():
    return rehearsal.tokenizer(rehearsal.documents(8, 600), vocab_size=300)


@pytest.fixture(scope="module", params=sorted(CASES))
def saved(request, tokenizer, tmp_path_factory):
    """(family, folder): the tiny quantized checkpoint, its output head sharpened so that the
    NLL is far from uniform and an expert computed wrong shows in it."""
    family = request.param
    method, arch = CASES[family]
    model = tiny.model(family, arch, len(tokenizer), seed=0, tok=tokenizer)
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    folder = tiny_quantized.save(model, tmp_path_factory.mktemp(family), method)
    tokenizer.save_pretrained(folder)
    return family, folder


def load(family, folder, dtype="float32"):
    """The pipeline's load: the offloaded layers' experts as stored."""
    torch.manual_seed(0)
    arch = CASES[family][1]
    return checkpoint.load(folder, dtype, "cpu", arch, family=family, stored_layers=LAYERS)


def reference(folder, dtype=torch.float32):
    """transformers' own load of the checkpoint, every expert dequantized."""
    from transformers import AutoModelForCausalLM

    config = checkpoint.read_config(folder)
    return AutoModelForCausalLM.from_pretrained(
        folder, dtype=dtype, **quantized.load_kwargs(config)
    ).eval()


def sequences(count=2, length=16):
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, 290, (length,), generator=generator).tolist() for _ in range(count)]


def test_the_checkpoint_is_in_the_hubs_layout(saved):
    family, folder = saved
    method, arch = CASES[family]
    config = json.loads((folder / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == method
    h, i, n = arch["hidden_size"], arch["intermediate_size"], arch["num_experts"]
    with safe_open(folder / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
        if method == "mxfp4":  # fused over the experts, as openai/gpt-oss-20b
            experts = "model.layers.1.mlp.experts"
            blocks = weights.get_tensor(f"{experts}.gate_up_proj_blocks")
            scales = weights.get_tensor(f"{experts}.down_proj_scales")
            assert (blocks.dtype, tuple(blocks.shape)) == (torch.uint8, (n, 2 * i, h // 32, 16))
            assert (scales.dtype, tuple(scales.shape)) == (torch.uint8, (n, h, i // 32))
            assert f"{experts}.gate_up_proj_bias" in names
            assert f"{experts}.gate_up_proj" not in names
        else:  # per expert, as deepseek-ai/DeepSeek-V3
            expert = "model.layers.1.mlp.experts.3.down_proj"
            weight = weights.get_tensor(f"{expert}.weight")
            scale = weights.get_tensor(f"{expert}.weight_scale_inv")
            assert (weight.dtype, tuple(weight.shape)) == (torch.float8_e4m3fn, (h, i))
            assert (scale.dtype, tuple(scale.shape)) == (torch.float32, (h // 128, i // 128))
            assert weights.get_tensor("model.layers.1.self_attn.o_proj.weight").dtype == (
                torch.float8_e4m3fn
            )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stored_experts_dequantize_to_transformers_own_weights(saved, dtype):
    family, folder = saved
    model, ref = load(family, folder, dtype), reference(folder, checkpoint.DTYPES[dtype])
    adapter = registry.of(model)
    for layer in LAYERS:
        stored, dense = adapter.layer_experts(model, layer), adapter.layer_experts(ref, layer)
        assert isinstance(stored, quantized.StoredExperts)
        for e in range(CASES[family][1]["num_experts"]):
            gate_up, gate_up_bias, down, down_bias = stored.dequantized(e, model.dtype)
            assert torch.equal(gate_up, dense.gate_up_proj[e])
            assert torch.equal(down, dense.down_proj[e])
            if dense.has_bias:
                assert torch.equal(gate_up_bias, dense.gate_up_proj_bias[e])
                assert torch.equal(down_bias, dense.down_proj_bias[e])
    # Everything else (the layer not offloaded included) exactly as transformers loads it.
    offloaded = tuple(f"model.layers.{layer}.mlp.experts." for layer in LAYERS)
    kept, theirs = model.state_dict(), ref.state_dict()
    assert {k for k in kept if not k.startswith(offloaded)} == {
        k for k in theirs if not k.startswith(offloaded)
    }
    assert all(torch.equal(v, theirs[k]) for k, v in kept.items() if not k.startswith(offloaded))


def test_the_pool_holds_and_copies_the_stored_bytes(saved):
    family, folder = saved
    model = load(family, folder)
    stored = quantized.expert_bytes(checkpoint.read_config(folder), 4)
    with decode.offloaded(model, LAYERS, CAPACITY, "cpu", 1) as off:
        host = off.hosts[LAYERS[0]]
        dtypes = {t.dtype for t in host.host.values()}
        assert dtypes & {torch.uint8, torch.float8_e4m3fn}
        assert host.expert_bytes == stored
        host.load(5, 0)  # a copy is the stored bytes
        assert all(torch.equal(host.slots[name][0], h[5]) for name, h in host.host.items())
    arch = CASES[family][1]
    dense = 3 * arch["hidden_size"] * arch["intermediate_size"] * 2  # bfloat16, no biases
    assert stored < dense * (0.3 if CASES[family][0] == "mxfp4" else 0.55)


def test_the_pooled_block_equals_transformers_dequantized_block(saved):
    family, folder = saved
    model, ref = load(family, folder), reference(folder)
    adapter = registry.of(model)
    sizes = adapter.sizes(model.config)
    make = decode.policy_factory(run_spec("lru"), CAPACITY, sizes.num_experts, 2)
    generator = torch.Generator().manual_seed(3)
    with decode.offloaded(model, LAYERS, CAPACITY, "cpu", 1) as off, torch.no_grad():
        arm = off.arm("lru", make, CAPACITY)
        for layer in LAYERS:
            block = arm.blocks[layer]
            block.reset()
            for _ in range(6):  # token by token, copies and evictions between them
                x = torch.randn(1, 1, sizes.hidden_size, generator=generator)
                pooled, theirs = block(x), adapter.block(ref, layer)(x)
                pooled = pooled[0] if isinstance(pooled, tuple) else pooled
                theirs = theirs[0] if isinstance(theirs, tuple) else theirs
                scale = theirs.abs().max().item()
                torch.testing.assert_close(pooled, theirs, rtol=1e-5, atol=1e-5 * scale)
            assert block.pool.steady + block.pool.fills > CAPACITY  # it did copy


def test_the_gates_pass_and_equal_transformers_dequantized_nll(saved):
    family, folder = saved
    report = gates.run(load(family, folder), sequences(), HARNESS)
    assert gates.failures(report) == []
    theirs = nll.batched_nll(reference(folder), sequences(), "cpu")
    assert report["base"]["nll"] == pytest.approx(theirs, abs=gates.BATCHED_TOLERANCE)
    for name, run in report["runs"].items():
        assert run["nll"] == pytest.approx(theirs, abs=gates.BATCHED_TOLERANCE), name


def settings_of(family, folder) -> dict:
    return {
        "seed": 0,
        "model": {
            "source": str(folder),
            "family": family,
            "dtype": "float32",
            "architecture": CASES[family][1],
        },
        "harness": HARNESS,
        "corpus": {"heldout": {"max_tokens": 16}},
    }


def test_the_stages_load_the_offloaded_layers_experts_as_stored(saved):
    from moecache.harness import jobs

    family, folder = saved
    model = jobs.load_model(settings_of(family, folder), str(folder), "cpu")
    adapter = registry.of(model)
    for layer in adapter.sizes(model.config).moe_layers:
        stored = isinstance(adapter.layer_experts(model, layer), quantized.StoredExperts)
        assert stored == (layer in LAYERS), layer


def test_the_plan_counts_the_stored_bytes_the_pool_holds(saved):
    family, folder = saved
    predicted = accountant.account(settings_of(family, folder))
    model = load(family, folder)
    with decode.offloaded(model, LAYERS, CAPACITY, "cpu", 1) as off:
        held = off.device_bytes()
        assert predicted["expert_bytes"] == off.hosts[LAYERS[0]].expert_bytes
    assert predicted["pinned_host_bytes"] == held["offloaded_expert_bytes"]
    assert predicted["slot_bytes"] == held["slot_bytes"]
    assert predicted["weights_bytes"] == held["weights_bytes"]


def test_gpt_oss_20b_plans_its_experts_at_about_a_quarter_of_bfloat16():
    from conftest import load_settings

    settings = load_settings(REPO / "config" / "gpt-oss-20b.yaml")
    report = accountant.account(settings)
    h = i = 2880
    blocks_and_scales = (2 * i * h + h * i) * (1 / 2 + 1 / 32)
    stored = blocks_and_scales + (2 * i + h) * 2  # the biases in bfloat16
    bf16 = (3 * h * i + 2 * i + h) * 2
    assert report["expert_bytes"] == stored
    assert 0.25 < report["expert_bytes"] / bf16 < 0.27
    layers = settings["harness"]["restricted_layers"]
    assert report["pinned_host_bytes"] == stored * 32 * len(layers)


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "family", "message"),
    [
        ({"quant_method": "awq"}, "qwen3_moe", "quantization 'awq': moecache keeps only mxfp4"),
        ({"quant_method": "mxfp4"}, "qwen3_moe", "mxfp4: moecache keeps it for gpt_oss"),
        (
            {**tiny_quantized.FP8_CONFIG, "scale_fmt": "ue8m0"},
            "deepseek_v3",
            "fp8: scale_fmt 'ue8m0' is not kept as stored",
        ),
        (tiny_quantized.FP8_CONFIG, "mixtral", "fp8: moecache keeps it for .* not mixtral"),
    ],
)
def test_a_quantization_not_kept_as_stored_is_refused_in_one_line(settings, family, message):
    config = tiny.config(family, {**BASE, "hidden_size": 32, "intermediate_size": 32}, 8)
    config.quantization_config = settings
    with pytest.raises(MoecacheError, match=message) as error:
        quantized.expert_bytes(config, 2)
    assert "\n" not in str(error.value)


def test_a_checkpoint_missing_a_stored_tensor_is_refused(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    family, folder = saved
    broken = tmp_path / "broken"
    broken.mkdir()
    for file in folder.iterdir():
        (broken / file.name).write_bytes(file.read_bytes())
    tensors = load_file(broken / "model.safetensors")
    gone = next(name for name in sorted(tensors) if "layers.2.mlp.experts" in name)
    del tensors[gone]
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    model = reference(folder)
    with pytest.raises(MoecacheError, match=f"checkpoint has no tensor {gone}"):
        quantized.stored_experts(
            broken, checkpoint.read_config(broken), registry.of(model), model, LAYERS
        )


def test_quantized_bytes_follow_the_formats_documented_sizes():
    """One GPT-OSS expert: 4.25 bits a weight (FP4 and an 8-bit exponent per 32); one
    DeepSeek-V3 expert: a byte a weight and a float32 per 128 x 128 block."""
    config = accountant.checkpoint_config(
        {"model": {"source": "openai/gpt-oss-20b", "architecture": {}}}
    )
    assert quantized.expert_bytes(config, 2) == 3 * 2880 * 2880 * 17 // 32 + (2 * 2880 + 2880) * 2
    v3 = tiny.config("deepseek_v3", {**BASE, "hidden_size": 7168, "intermediate_size": 2048}, 8)
    v3.quantization_config = tiny_quantized.FP8_CONFIG
    grid = math.ceil(7168 / 128) * math.ceil(2048 / 128)
    assert quantized.expert_bytes(v3, 2) == 3 * (7168 * 2048 + grid * 4)


def test_fp8_blocks_at_the_far_edges_may_be_partial():
    """DeepSeek-V3's kv_a_proj_with_mqa is 576 rows of 128-row blocks: the last block has 64."""
    weight = torch.ones(200, 130).to(torch.float8_e4m3fn)
    scale_inv = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    out = quantized.fp8(weight, scale_inv, (128, 128), torch.float32)
    assert (out[0, 0], out[127, 128], out[128, 127], out[199, 129]) == (1.0, 2.0, 3.0, 4.0)


def test_the_gates_pass_on_the_cuda_path_for_the_stored_kernels(saved):
    """The stored formats' kernel (dequantized one expert at a time) on the CUDA path,
    rehearsed on the CPU (gpu.py): the own block's experts staged, pinned pools, the gates
    at C < N against the model's own NLL."""
    from moecache import gpu

    family, folder = saved
    with gpu.rehearse():
        model = load(family, folder)
        report = gates.run(model, sequences(), HARNESS)
        assert placement.staging_of(model) is not None
    assert gates.failures(report) == []


def test_mxfp4_dequantizes_a_chunk_of_rows_at_a_time_to_the_same_values(monkeypatch):
    """Row chunks (which bound the device's temporaries per expert) give the whole
    projection's values exactly, a chunk boundary inside the rows included."""
    generator = torch.Generator().manual_seed(5)
    blocks = torch.randint(0, 256, (37, 4, 16), dtype=torch.uint8, generator=generator)
    scales = torch.randint(110, 140, (37, 4), dtype=torch.uint8, generator=generator)
    whole = quantized.mxfp4_rows(blocks, scales, torch.bfloat16)
    monkeypatch.setattr(quantized, "DEQUANT_CHUNK_VALUES", 5 * 128)  # 5 rows of 128 values
    assert torch.equal(quantized.mxfp4(blocks, scales, torch.bfloat16), whole)
    assert whole.shape == (37, 128)


@pytest.mark.parametrize("chunk", [10**9, 3 * 128], ids=["whole", "chunked"])
def test_the_accountant_counts_a_dequantized_expert_as_the_plan_sizes_it(saved, chunk, monkeypatch):
    """The dequantized weights and the chunks' temporaries, counted by the accountant while
    the kernel holds them: their peak is what the plan adds for a stored expert."""
    import gc

    from moecache.model import memory
    from moecache.model.memory import LEDGER

    monkeypatch.setattr(quantized, "DEQUANT_CHUNK_VALUES", chunk)
    family, folder = saved
    model = load(family, folder)
    experts = registry.of(model).layer_experts(model, LAYERS[0])
    gc.collect()
    LEDGER.reset()
    weights = experts.dequantized(3, torch.float32)
    del weights
    gc.collect()
    config = checkpoint.read_config(folder)
    assert LEDGER.peak[memory.DEVICE] == quantized.dequantized_bytes(config, 4)
    assert LEDGER.bytes(memory.DEVICE) == 0
