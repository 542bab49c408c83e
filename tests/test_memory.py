"""The accountant (model/memory.py) against `moecache plan`: every config of config/ at its
real per-layer shapes (hidden size, expert width, N, k, the family's real attention),
with one MoE layer, a small vocabulary, random weights and a few tokens, through the
real loading, gates and decode code; the accountant's device and host peaks of each job
within 5% below the plan's figures for the same layers, and never above them, in each
phase of a job: its load (what transformers holds while it reads the checkpoint, by the
host census), its gates and its decode. Also: loading keeps one host copy of the
offloaded experts, the slots each run holds are its own C, and an own block whose
experts are staged one layer at a time gives the model's own NLL."""

from __future__ import annotations

import copy
import gc
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY_ARCH, load_settings, load_yaml

from moecache import config as configs
from moecache import gpu
from moecache.harness import gates, jobs, nll, placement, runs
from moecache.model import checkpoint, memory, registry, tiny
from moecache.model.memory import LEDGER
from moecache.schedule import accountant
from moecache.schedule import runs as schedule

# Every config with a model (a trace study, config/trace.yaml, has none to hold), the cards'
# too.
CONFIGS = sorted(p for p in (REPO / "config").glob("**/*.yaml") if "model" in load_yaml(p))
VOCAB = 256
TOKENS = 5
NEEDS_FILES = {"controller", "learned"}  # policies that read a trained artifact


def transformers_config(settings: dict):
    """The checkpoint's config as the plan reads it; a rehearsal's tiny checkpoint (built by
    tests/rehearsal/build.py at run time) from its family and sizes."""
    model = settings["model"]
    if str(model["source"]).startswith("rehearsal/"):
        return tiny.config(configs.family(settings), model["architecture"], VOCAB)
    return accountant.checkpoint_config(settings)


def one_moe_layer(settings: dict, tmp_path: Path) -> tuple[dict, Path]:
    """The config's model cut to its first MoE layer (and the dense layers before it), at
    the config's dtype with random weights, saved as a checkpoint; settings that offload
    that layer, decode on the CPU, and keep the runs that need no trained artifact."""
    config = transformers_config(settings)
    adapter = registry.adapter_for(config.model_type)
    layer = adapter.sizes(config).moe_layers[0]
    config.num_hidden_layers = layer + 1
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[: layer + 1]
    config.vocab_size = VOCAB
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(config, key, None)
    config.tie_word_embeddings = False
    # Dense at the real shapes (quantizing a real-sized MXFP4 layer takes minutes on a CPU):
    # the stored formats' bytes are held to the pool's by tests/test_quantized.py.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    dtype = accountant.checkpoint.DTYPES[settings["model"]["dtype"]]
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((torch.rand(p.shape, generator=generator) - 0.5).to(p.dtype) * 0.05)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.zero_()
    folder = tmp_path / "checkpoint"
    model.save_pretrained(folder)
    del model
    gc.collect()

    settings = copy.deepcopy(settings)
    arch = settings["model"]["architecture"]
    arch["num_hidden_layers"] = layer + 1
    settings["model"].update(source=str(folder))
    harness = settings["harness"]
    harness.update(
        device="cpu", restricted_layers=[layer], warmup_tokens=1, gate_repeats=1, repeats=1
    )
    harness.pop("device_gib", None)
    harness["runs"] = peak_runs(harness)
    settings["corpus"]["heldout"]["max_tokens"] = TOKENS
    return settings, folder


def peak_runs(harness: dict) -> dict:
    """The runs that make a decode job's peak, so that real shapes decode in seconds: the
    trace run and the all-resident runs (the 1x storage is their largest C), and the
    scaled run whose group holds the most slots (blocking where one ties: an overlapped
    run's slower link really waits on the CPU); none that needs a trained artifact."""
    runs = {
        name: run
        for name, run in harness["runs"].items()
        if not any(run["policy"].startswith(p) for p in NEEDS_FILES)
    }

    def group(run):
        scaled = [m for m in run.get("multipliers", [1]) if m > 1]
        return (1 + len(scaled)) * run.get("capacity", harness["capacity"]) if scaled else 0

    keep = {harness["trace_run"]} | {n for n, run in runs.items() if run["policy"] == "all"}
    largest = max(runs, key=lambda n: (group(runs[n]), not runs[n].get("overlap")))
    if group(runs[largest]):
        keep.add(largest)
    return {name: slowed(run) for name, run in runs.items() if name in keep}


def slowed(run: dict) -> dict:
    """The run with its multipliers above 1 made 2, 3, ...: the same arms, slots and rings
    (what the peak is made of), without pushing 50 copies of each real-sized expert through
    the ring on a CPU."""
    scaled = [m for m in run.get("multipliers", [1]) if m > 1]
    if not scaled:
        return run
    return run | {"multipliers": [1, *range(2, 2 + len(scaled))]}


# The gates and decode jobs' work (gates.run, runs.decode_runs) on a real-sized MoE layer of
# every config (minutes on a CPU): a pipeline test.
@pytest.mark.pipeline
@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_the_accountants_peaks_are_the_plans_for_every_config(path, tmp_path):
    with gpu.rehearse():  # the CUDA path's staging, pinned pools and rings, on the CPU
        held_to_the_plan(path, tmp_path)


def held_to_the_plan(path, tmp_path) -> None:
    settings, folder = one_moe_layer(load_settings(path), tmp_path)
    sequences = [list(range(1, TOKENS + 1)), list(range(7, 7 + TOKENS))]
    planned = accountant.account(settings, source=str(folder), tokens=TOKENS)

    model = jobs.load_model(settings, str(folder), "cpu")  # resets the accountant
    loaded_host = LEDGER.bytes(memory.HOST)
    assert loaded_host == planned["pinned_host_bytes"]  # one host copy of the experts

    LEDGER.begin("gates")
    gates.run(model, sequences, settings["harness"], settings["seed"])
    gc.collect()
    LEDGER.begin("decode")
    shard = next(iter(settings["corpus"]["heldout"]["shards"]))
    runs.decode_runs(settings, model, sequences, runs.runs_for_shard(settings, shard, shard))
    parts = LEDGER.report()
    peaks = parts["phase_peak_bytes"]  # load: transformers' reading, by the host census

    for phase, peak in peaks.items():
        # Never below the peak, and no more than 5% above it, on the device and the host.
        host = planned["host_phase_peak_bytes"][phase]
        assert peak[memory.HOST] <= host <= 1.05 * peak[memory.HOST], (phase, peak, planned)
        if phase != memory.LOAD:  # the device's load is the gates' and decode's weights
            expected = planned["job_device_peak_bytes"][phase]
            assert peak[memory.DEVICE] <= expected <= 1.05 * peak[memory.DEVICE], (phase, parts)
    assert set(peaks) == {memory.LOAD, "gates", "decode"}
    assert planned["device_peak_bytes"] == max(planned["job_device_peak_bytes"].values())
    assert planned["host_ram_bytes"] == max(planned["host_phase_peak_bytes"].values())


def test_each_run_holds_its_own_capacity_and_the_shared_storage_its_largest(smoke_config):
    """Slots by what runs: the 1x runs share the largest C among them, a scaled group's arms
    hold C each, and no arm is given N slots unless it is the all-resident run."""
    settings = smoke_config
    shard = next(iter(settings["corpus"]["heldout"]["shards"]))
    planned = runs.runs_for_shard(settings, shard, shard)
    shared, groups = schedule.slot_layout(planned)
    # `moecache plan` sizes the job from the same runs, without building their policies.
    assert schedule.slot_layout(schedule.shard_slots(settings, shard, shard, True)) == (
        shared,
        groups,
    )
    num_experts = settings["model"]["architecture"]["num_experts"]
    assert shared == num_experts  # the smoke config keeps its all-resident reference
    scaled = [run for run in planned.values() if run.multiplier > 1]
    assert groups and all(g % settings["harness"]["capacity"] == 0 for g in groups)
    assert all(run.capacity < num_experts for run in scaled)
    without = {label: run for label, run in planned.items() if run.spec["policy"] != "all"}
    assert schedule.slot_layout(without)[0] == max(run.capacity for run in without.values())


def test_a_reference_the_device_cannot_hold_is_left_out_in_one_line(smoke_config, capsys):
    settings = smoke_config
    settings["harness"]["device_gib"] = 1e-6
    reason = accountant.reference_left_out(settings)
    assert reason and "all-resident reference left out" in reason and "\n" not in reason
    shard = next(iter(settings["corpus"]["heldout"]["shards"]))
    planned = runs.runs_for_shard(settings, shard, shard)
    assert all(run.spec["policy"] != "all" for run in planned.values())
    assert "left out" in capsys.readouterr().err
    assert accountant.account(settings)["reference_kept"] is False
    settings["harness"]["device_gib"] = 80
    assert accountant.reference_left_out(settings) is None


def test_staged_own_blocks_give_the_models_own_nll_one_layer_at_a_time(smoke_config):
    """What a GPU does when the model's own block runs over offloaded experts (their N
    experts staged onto the device one layer at a time), forced on a CPU: the same NLL as
    the model with its experts in place, and never more than one layer's experts staged."""
    arch = smoke_config["model"]["architecture"]
    model = tiny.model("olmoe", arch, 64, seed=0)
    sequences = [list(range(1, 20)), list(range(5, 30))]
    before = nll.batched_nll_sums(model, sequences, "cpu")
    LEDGER.reset()
    layers = [1, 2]
    placement.offload_experts(model, layers, "cpu", stage=True)
    experts = registry.of(model).layer_experts(model, 1)
    one_layer = memory.tensor_bytes(experts.parameters())
    assert nll.batched_nll_sums(model, sequences, "cpu") == before
    # One staging buffer for both layers (beside the check's logits and KV cache).
    assert LEDGER.peak_parts[memory.DEVICE]["staging"] == one_layer
    assert all(p.device.type == "cpu" for p in experts.parameters())  # back on the host
    assert placement.take_staging_seconds(model) > 0


TRANSIENT_ARCH = TINY_ARCH | {"num_experts": 8, "num_experts_per_tok": 2}


@pytest.mark.parametrize("family", sorted(registry.ADAPTERS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_nll_check_and_kv_cache_are_counted_as_the_plan_sizes_them(family, dtype):
    """The whole-sequence check's logits, float32 scores and log-probabilities and its KV
    cache, counted by the accountant while alive, are what the plan adds for them
    (memory.nll_check_bytes, accountant.kv_bytes_per_token) in every family and dtype."""
    model = tiny.model(family, TRANSIENT_ARCH, 64, seed=0).to(dtype)
    element = torch.empty(0, dtype=dtype).element_size()
    tokens = 11
    gc.collect()
    LEDGER.reset()
    nll.batched_nll_sums(model, [list(range(1, tokens + 1))], "cpu")
    parts = LEDGER.peak_parts[memory.DEVICE]
    assert parts["nll check"] == memory.nll_check_bytes(tokens, 64, element)
    kv = accountant.kv_bytes_per_token(model.config, element) * tokens
    assert parts["kv cache"] <= kv <= 1.05 * parts["kv cache"], (parts, kv)
    assert LEDGER.bytes(memory.DEVICE) == 0  # nothing left counted once they are freed


def test_the_load_phase_is_sized_in_the_order_transformers_fuses_the_experts():
    """OLMoE's down_proj is fused before gate_up_proj (its keys sort first), Mixtral's w1
    and w3 before w2; GPT-OSS's checkpoint holds its experts fused already. The peak is
    the files, every fused expert before the last pair, and that pair's two stacks beside
    its result (the census's figures for one MoE layer: OLMoE 802 + 768 + 512 MiB, Mixtral
    2772 + 2688 + 896 MiB)."""
    assert checkpoint.fused_in_order("olmoe") == [("down_proj", False), ("gate_up_proj", True)]
    assert checkpoint.fused_in_order("mixtral") == [("gate_up_proj", True), ("down_proj", False)]
    assert checkpoint.fused_in_order("gpt_oss") == []
    mib = 2**20
    olmoe = checkpoint.load_host_peak(
        802 * mib, [{"gate_up_proj": 512 * mib, "down_proj": 256 * mib}], "olmoe"
    )
    small = checkpoint.SMALL_TENSOR_BYTES
    assert olmoe["host_load_peak_bytes"] == (802 + 768 + 512) * mib + small
    assert olmoe["host_loaded_bytes"] == (802 + 768) * mib
    mixtral = [{"gate_up_proj": 1792 * mib, "down_proj": 896 * mib}]
    assert checkpoint.load_host_peak(2772 * mib, mixtral, "mixtral")["host_load_peak_bytes"] == (
        (2772 + 2688 + 896) * mib + small
    )
