"""`make gpu-check`: one line and no file without CUDA; its parts, at reduced sizes, on the
CPU (the same code the GPU runs, with the CPU's clock in place of CUDA events)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from conftest import REPO, SMOKE, load_yaml, moecache

from moecache import provenance
from moecache.errors import MoecacheError
from moecache.harness import (
    check_models,
    check_parts,
    check_sizes,
    gates,
    gpu_check,
    nll,
    paper_check,
)

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")

TINY_PAPER = {"hidden_size": 64, "intermediate_size": 32, "num_experts": 16}
# The paper-shaped OLMoE at reduced sizes (tests/test_paper_check.py runs both models).
TINY_OLMOE = dataclasses.replace(
    paper_check.PAPER_MODELS["olmoe"],
    vocab=128,
    shrink={
        "hidden_size": 32,
        "intermediate_size": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
    },
)
TINY_PACE = {"sequences": 2, "tokens": 8, "warmup_tokens": 1, "repeats": 1}


@no_cuda
def test_refuses_in_one_line_without_cuda(tmp_path):
    out = tmp_path / "check" / "here.json"
    result = moecache("gpu-check", "--out", str(out))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0], result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not out.exists() and not out.parent.exists()


@no_cuda
def test_run_refuses_before_measuring(tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("measured without CUDA")

    monkeypatch.setattr(check_parts, "measure_device", never)
    with pytest.raises(MoecacheError, match="^no CUDA device"):
        gpu_check.run(tmp_path / "x.json", "cuda:0")
    assert list(tmp_path.iterdir()) == []


def test_make_target():
    text = (REPO / "Makefile").read_text()
    assert "gpu-check" in text.split(".PHONY:")[1].splitlines()[0]
    # Into the folder report.devices names files of, so that Table 1 can read it.
    assert "gpu-check: venv\n\tmoecache gpu-check --out measured/gpu-check/" in text


def test_paper_layer_is_seeded_and_shaped():
    a = check_models.paper_experts({**check_sizes.PAPER_LAYER, **TINY_PAPER}, seed=3)
    b = check_models.paper_experts({**check_sizes.PAPER_LAYER, **TINY_PAPER}, seed=3)
    assert a.gate_up_proj.shape == (16, 64, 64) and a.down_proj.shape == (16, 64, 32)
    assert a.gate_up_proj.dtype == a.down_proj.dtype == torch.bfloat16
    assert a.gate_up_proj.device.type == "cpu"
    assert torch.equal(a.gate_up_proj, b.gate_up_proj) and torch.equal(a.down_proj, b.down_proj)
    assert 0.015 < a.gate_up_proj.float().std() < 0.025


def test_measure_device_on_the_cpu(tmp_path):
    lines = []
    report, settings = check_parts.measure_device(
        "cpu",
        sequences=2,
        tokens=12,
        harness={"warmup_tokens": 2, "repeats": 2, "link_ring_mib": 1},
        multipliers=(1, 3),
        ring_mib=1,
        rounds=2,
        paper=TINY_PAPER,
        paper_multipliers=(1,),
        paper_ring_mib=1,
        log=lines.append,
        families=("qwen3_moe",),
        paper_models={"olmoe": TINY_OLMOE},
        paper_pace=TINY_PACE,
    )
    assert report["errors"] == {}, report["errors"]
    assert report["skipped"] == {}  # the budget is a GPU's 8 minutes
    # The paper-shaped model through the real path: its jobs' peaks and the overlap timing.
    paper = report["paper_models"]["olmoe"]
    assert set(paper["memory"]) == {"gates", "decode"} and set(paper["overlap"]) == {"1", "10"}
    assert settings["paper_models"]["models"]["olmoe"]["layers"] == 4
    assert settings["budget_s"] == check_sizes.BUDGET_S
    assert any(line.startswith("  olmoe x10 ms/token: lru ") for line in lines)
    # Another family's tiny model through the same gates, exact in float32.
    assert set(report["families"]["qwen3_moe"]) == {"float32", "bfloat16"}
    assert not [f for f in report["families"]["qwen3_moe"]["float32"]["failures"] if "NLL" in f]
    assert {"device_name", "bandwidth", "paper_layer", "gates", "memory"} <= set(report)
    assert set(report["gates"]) == set(report["memory"]) == {"float32", "bfloat16"}
    # Exact in float32 (the throughput gate's 0.95 is a GPU's, not a loaded CPU's).
    assert not [f for f in report["gates"]["float32"]["failures"] if "NLL" in f]
    for r in report["gates"].values():
        assert isinstance(r["failures"], list) and r["passed"] == (not r["failures"])
        assert r["throughput_ratio_pool_vs_own_block"] > 0
        assert len(r["throughput_ratio_ci"]) == 2
    assert set(report["bandwidth"]["multipliers"]) == {"1", "3"}
    assert set(report["paper_layer"]["multipliers"]) == {"1"}
    # The paper layer's copy figures, repeated at the top level.
    paper = report["paper_layer"]
    assert paper["expert_bytes"] == (2 * 32 * 64 + 64 * 32) * 2
    assert paper["layer"]["layer_bytes"] == 16 * paper["expert_bytes"]
    for key in ("tau_ms", "loop_gib_per_s", "large_gib_per_s"):
        assert report[key] == paper[key] and math.isfinite(paper[key])
    arch = load_yaml(SMOKE)["model"]["architecture"]
    expert = 3 * arch["hidden_size"] * arch["intermediate_size"]
    for dtype, size in (("float32", 4), ("bfloat16", 2)):
        held = report["memory"][dtype]
        assert held["offloaded_experts_on_host"] and held["other_weights_on_device"]
        assert held["offloaded_expert_bytes"] == 2 * arch["num_experts"] * expert * size
        assert held["slot_bytes"] == 2 * 8 * expert * size
        assert held["held_bytes"] == held["weights_bytes"] + held["slot_bytes"]
    assert settings["harness"]["device"] == "cpu" and settings["seed"] == check_sizes.SEED
    assert any("paper layer" in line for line in lines)
    # One results file, with the copy figures a device row of Table 1 reads.
    out = tmp_path / "gpu-check" / "cpu.json"
    provenance.write_results(out, report, settings, "cpu")
    written = json.loads(out.read_text())
    assert written["device_name"] and written["settings_hash"]
    for part in ("bandwidth", "paper_layer"):
        for key in ("tau_ms", "loop_gib_per_s", "large_gib_per_s", "group_overhead_ms"):
            assert written[part][key] == report[part][key]
        for row in written[part]["multipliers"].values():
            # Two rounds of CPU copies time nothing reliably: the fields, not their sizes.
            assert math.isfinite(row["tau_ms"]) and math.isfinite(row["ratio_to_1x"])
    assert written["gates"]["bfloat16"]["failures"] == report["gates"]["bfloat16"]["failures"]


def test_the_smoke_settings_come_from_the_smoke_config():
    smoke = load_yaml(SMOKE)
    sizes = check_sizes.smoke_sizes("cpu")
    assert sizes.arch == smoke["model"]["architecture"]
    assert sizes.vocab == smoke["tokenizer"]["vocab_size"]
    assert sizes.experts_implementation == smoke["model"]["experts_implementation"]
    for key in check_sizes.SMOKE_HARNESS_KEYS:
        assert sizes.harness[key] == smoke["harness"][key]
    # A GPU's floor and passes: the schema's defaults, not the smoke file's seconds-scale ones.
    assert sizes.harness["min_throughput_ratio"] == 0.95 != smoke["harness"]["min_throughput_ratio"]
    assert sizes.harness["gate_repeats"] == 3 != smoke["harness"]["gate_repeats"]
    assert sizes.harness["device"] == "cpu"


def test_a_failed_gate_is_written_then_refused_naming_it(tmp_path, monkeypatch):
    """A gate forced to fail (a negative tolerance, so that even an exact NLL is over it):
    the results file is written, then one line names the model, the dtype and the gate."""
    monkeypatch.setattr(gates, "POOL_TOLERANCE", -1.0)
    report, settings = check_parts.measure_device(
        "cpu",
        sequences=1,
        tokens=8,
        dtypes=("float32",),
        harness={
            "warmup_tokens": 2,
            "gate_repeats": 1,
            "link_ring_mib": 1,
            "min_throughput_ratio": 0,
        },
        multipliers=(1,),
        ring_mib=1,
        rounds=1,
        paper=TINY_PAPER,
        paper_multipliers=(1,),
        paper_ring_mib=1,
        log=lambda line: None,
        families=(),
        paper_models={},
    )
    assert report["errors"] == {}
    out = tmp_path / "gpu-check" / "cpu.json"
    with pytest.raises(MoecacheError) as refused:
        gpu_check.finish(out, report, settings, "cpu", log=lambda line: None)
    (line,) = str(refused.value).splitlines()
    assert line.startswith("gpu-check failed: gate float32: lru NLL ")
    assert "all-resident NLL" in line and str(out) in line
    written = json.loads(out.read_text())
    assert not written["gates"]["float32"]["passed"]
    monkeypatch.setattr(gates, "POOL_TOLERANCE", 5e-3)
    report["gates"]["float32"]["failures"] = gates.failures(report["gates"]["float32"])
    assert gpu_check.failed_gates(report) == []


def test_a_lower_precision_is_held_to_its_own_rounding():
    """bfloat16's tolerance is twice how far its rounding moves the batched NLL from the
    same weights in float32, never below float32's; a gap past it still fails the gate."""
    held = check_parts.rounding_tolerance(8.7645, 8.7698)
    assert held["rounding_nll"] == pytest.approx(5.3e-3)
    assert held["batched_tolerance"] == pytest.approx(1.06e-2)
    assert check_parts.rounding_tolerance(8.7, 8.7)["batched_tolerance"] == gates.BATCHED_TOLERANCE
    report = {
        "base": {"nll": 8.7645 + 0.02},
        "batched_nll": 8.7645,
        "runs": {},
        "throughput_ratio_pool_vs_own_block": 1.0,
        "min_throughput_ratio": 0.95,
        **held,
    }
    (failure,) = gates.failures(report)
    assert failure.startswith("teacher-forced NLL") and "> 1.1e-02" in failure
    report["base"]["nll"] = 8.7645 + 1.86e-3  # what an H200 gave: bfloat16's rounding
    assert gates.failures(report) == []


def test_the_bfloat16_tolerance_is_measured_on_the_same_model():
    """On the smoke model in bfloat16 the derived tolerance passes its own teacher-forced
    NLL and stays below what one wrong expert does to the NLL (a real discrepancy)."""
    sizes = check_sizes.smoke_sizes("cpu", tokens=32)
    model = check_models.smoke_model(sizes.arch, sizes.vocab, 0).to(torch.bfloat16)
    ids = check_models.smoke_sequences(sizes.vocab, 2, 32, 0)
    with torch.inference_mode():
        batched = nll.batched_nll(model, ids, "cpu")
        exact = nll.batched_nll(check_models.float32_copy(model), ids, "cpu")
        tolerance = check_parts.rounding_tolerance(batched, exact)["batched_tolerance"]
        experts = model.model.layers[1].mlp.experts
        experts.down_proj.data = experts.down_proj.data.roll(1, dims=0)  # expert e computes e-1
        wrong = nll.batched_nll(model, ids, "cpu")
    assert gates.BATCHED_TOLERANCE <= tolerance < abs(wrong - batched)


def test_a_part_past_the_budget_is_skipped_and_said_so(tmp_path):
    parts = check_parts.Parts("cpu", lambda line: None, budget_s=100)
    assert parts.step("quick", lambda: 1, estimate_s=50) == 1
    assert parts.step("long", lambda: pytest.fail("ran past the budget"), estimate_s=200) is None
    assert parts.skipped["long"].startswith("skipped: ")
    assert parts.skipped["long"].endswith("about 200 s for it would pass the 100 s budget")
    assert parts.missing("long") == {"skipped": parts.skipped["long"]}
    assert parts.errors == {}
    # With no time at all every part is skipped; the file says which, and that is no failure.
    lines = []
    report, settings = check_parts.measure_device(
        "cpu",
        sequences=1,
        tokens=8,
        families=("qwen3_moe",),
        paper_models={"olmoe": TINY_OLMOE},
        paper_pace=TINY_PACE,
        budget_s=0,
        log=lines.append,
    )
    assert report["errors"] == {}
    expected = {"load float32", "load bfloat16", "bandwidth", "paper layer", "paper olmoe"}
    assert set(report["skipped"]) == expected | {"build qwen3_moe"}
    assert report["gates"]["float32"] == {"skipped": report["skipped"]["load float32"]}
    assert report["paper_models"]["olmoe"] == {"skipped": report["skipped"]["paper olmoe"]}
    out = tmp_path / "gpu-check" / "cpu.json"
    gpu_check.finish(out, report, settings, "cpu", log=lines.append)
    assert json.loads(out.read_text())["skipped"] == report["skipped"]
    assert "paper olmoe: skipped: " in "\n".join(lines)
