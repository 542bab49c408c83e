"""gpu-check's paper-shaped models (harness/paper_check.py): their real shapes and what the
plan says they hold, and, at reduced sizes on the CPU, the whole path a GPU runs: written as
checkpoints (GPT-OSS's experts as MXFP4), loaded by jobs.load_model, the gates and decode
jobs, the accountant against the plan, blocking against overlapped copies."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from safetensors import safe_open

from moecache.errors import MoecacheError
from moecache.harness import check_parts, check_sizes, gpu_check, paper_check, runs
from moecache.harness.check_models import paper_checkpoint
from moecache.model import checkpoint
from moecache.schedule import accountant

OLMOE = {
    "hidden_size": 64,
    "intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
}
GPT_OSS = {
    "hidden_size": 64,
    "intermediate_size": 64,  # MXFP4 packs 32 inputs a block
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "experts_per_token": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}
TINY_MODELS = {
    "olmoe": dataclasses.replace(paper_check.PAPER_MODELS["olmoe"], vocab=256, shrink=OLMOE),
    "gpt_oss": dataclasses.replace(paper_check.PAPER_MODELS["gpt_oss"], vocab=256, shrink=GPT_OSS),
}
PACE = {"sequences": 2, "tokens": 8, "warmup_tokens": 1, "repeats": 2}


def test_the_models_have_the_checkpoints_shapes_cut_to_a_few_layers(tmp_path):
    """OLMoE-1B-7B's and GPT-OSS-20B's own sizes, from config/checkpoints/, with fewer
    layers; planned (config alone, no weights) on a CUDA device, they fit an H100 with room."""
    olmoe = paper_check.checkpoint_config(paper_check.PAPER_MODELS["olmoe"])
    assert (olmoe.hidden_size, olmoe.intermediate_size, olmoe.num_experts) == (2048, 1024, 64)
    assert (olmoe.num_experts_per_tok, olmoe.num_hidden_layers, olmoe.vocab_size) == (8, 4, 50304)
    oss = paper_check.checkpoint_config(paper_check.PAPER_MODELS["gpt_oss"])
    assert (oss.hidden_size, oss.intermediate_size, oss.num_local_experts) == (2880, 2880, 32)
    assert oss.num_hidden_layers == len(oss.layer_types) == 2
    pace, expert = check_sizes.PAPER_PACE, {}
    for name, config in (("olmoe", olmoe), ("gpt_oss", oss)):
        model = paper_check.PAPER_MODELS[name]
        settings = paper_check.paper_settings(model, config, tmp_path, "cuda", pace)
        planned = accountant.account(settings, source=config, tokens=pace["tokens"])
        assert planned["offloaded_layers"] == list(model.restricted)
        assert settings["harness"]["capacity"] == planned["num_experts"] // 2
        assert planned["device_peak_bytes"] < 12 * 2**30  # of an H100's ~78 GiB
        expert[name] = planned["expert_bytes"]
    # 12.6 MB an OLMoE expert in bfloat16; GPT-OSS's stored as MXFP4, about a quarter.
    assert expert["olmoe"] == 3 * 2048 * 1024 * 2
    assert expert["gpt_oss"] < 3 * 2880 * 2880 * 2 / 3


def test_a_quantized_checkpoint_is_written_as_stored(tmp_path):
    model = TINY_MODELS["gpt_oss"]
    config = paper_check.checkpoint_config(model)
    folder = paper_checkpoint(config, checkpoint.DTYPES["bfloat16"], tmp_path / "m", 0, "mxfp4")
    written = json.loads((folder / "config.json").read_text())
    assert written["quantization_config"]["quant_method"] == "mxfp4"
    with safe_open(folder / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert "model.layers.1.mlp.experts.down_proj_blocks" in names
    assert "model.layers.1.mlp.experts.down_proj" not in names


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_the_real_path_on_the_cpu(name):
    """Written, loaded by jobs.load_model, gates and decode: the accountant's peaks within
    5% of the plan's in both jobs (no allocator on a CPU); the OLMoE's blocking and
    overlapped LRU timed at 1x and at the slower link."""
    lines = []
    report = paper_check.measure(name, TINY_MODELS[name], "cpu", PACE, 0, lines.append)
    assert set(report["memory"]) == {"gates", "decode"}
    for held in report["memory"].values():
        assert held["allocator_peak_bytes"] is None
        assert abs(held["ledger_to_plan_device"] - 1) <= paper_check.PLAN_SHARE
        assert abs(held["ledger_to_plan_host"] - 1) <= paper_check.PLAN_SHARE
        assert held["ledger_host_peak_bytes"] == held["plan_host_peak_bytes"]
    assert paper_check.memory_failures(name, report["memory"]) == []
    assert any(f"{name} decode: accountant" in line for line in lines)
    if name == "gpt_oss":  # stored, not dequantized: about a quarter of bfloat16's bytes
        assert report["expert_bytes"] < 3 * 64 * 64 * 2 / 3
        assert "overlap" not in report
        return
    timing = report["overlap"]
    assert set(timing) == {"1", str(paper_check.SLOW_MULTIPLIER)}
    for m, rows in timing.items():
        assert set(rows) == {paper_check.BLOCKING, *paper_check.OVERLAPPED}
        for run, row in rows.items():
            low, high = row["ms_per_token_ci"]
            assert math.isfinite(row["ms_per_token"]) and low <= row["ms_per_token"] <= high
            assert ("twin_ms_per_token" in row) == (m != "1")
            if run != paper_check.BLOCKING:
                assert row["overlap_helped"] in ("faster", "slower", "within noise")
                assert "stall_ms" in row
    # The same copies, blocking or overlapped without a prefetcher.
    assert timing["1"]["lru"]["copies_per_token"] == timing["1"]["lru-overlap"]["copies_per_token"]


def test_overlap_is_judged_by_its_interval():
    blocking = {"ms_per_token_ci": [10.0, 12.0]}
    assert paper_check.verdict({"ms_per_token_ci": [7.0, 9.5]}, blocking) == "faster"
    assert paper_check.verdict({"ms_per_token_ci": [12.5, 13.0]}, blocking) == "slower"
    assert paper_check.verdict({"ms_per_token_ci": [9.0, 10.5]}, blocking) == "within noise"


def memory_of(ratio: float) -> dict:
    planned = 10 * 2**30
    return {
        "decode": {
            "ledger_device_peak_bytes": int(ratio * planned),
            "plan_device_peak_bytes": planned,
            "ledger_to_plan_device": ratio,
            "ledger_host_peak_bytes": 2**30,
            "plan_host_peak_bytes": 2**30,
            "ledger_to_plan_host": 1.0,
            "allocator_peak_bytes": None,
        }
    }


def test_an_accountant_off_the_plan_fails_the_check_in_one_line(tmp_path):
    assert paper_check.memory_failures("paper olmoe", memory_of(1.049)) == []
    (failure,) = paper_check.memory_failures("paper olmoe", memory_of(1.07))
    assert failure.startswith("paper olmoe decode: the accountant's device peak 10.700 GiB")
    assert "+7.0% off the plan's 10.000 GiB" in failure
    report = {
        "device_name": "cpu",
        "gates": {},
        "tau_ms": None,
        "errors": {},
        "skipped": {},
        "seconds": 1.0,
        "paper_models": {"olmoe": {"memory": memory_of(0.9)}},
    }
    out = tmp_path / "gpu-check" / "cpu.json"
    with pytest.raises(MoecacheError) as refused:
        gpu_check.finish(out, report, {"seed": 0}, "cpu", log=lambda line: None)
    (line,) = str(refused.value).splitlines()
    assert "paper olmoe decode: the accountant's device peak" in line and "-10.0%" in line
    assert json.loads(out.read_text())["paper_models"]["olmoe"]["memory"]


def test_the_timing_reads_each_run_at_each_multiplier():
    def totals(ms):
        return {"totals": {"step_ms": ms, "step_ms_ci": [ms - 1, ms + 1], "copies_per_token": 2}}

    m = paper_check.SLOW_MULTIPLIER
    results, twins = {}, {}
    for i, name in enumerate((paper_check.BLOCKING, *paper_check.OVERLAPPED)):
        results[f"{name}-x1"] = totals(10.0 - i)
        results[f"{name}-x{m}"] = totals(40.0 - 10 * i)
        twins[name] = totals(10.0)
    timing = paper_check.overlap_timing(runs.Decoded(results, {}, twins, {}))
    assert timing["1"]["lru-overlap"]["overlap_helped"] == "within noise"
    assert timing[str(m)]["lru-overlap-pregate"]["overlap_helped"] == "faster"
    assert timing[str(m)]["lru-overlap-pregate"]["to_blocking"] == pytest.approx(0.5)
    assert timing[str(m)]["lru"]["twin_ms_per_token"] == 10.0


def test_a_stage_that_raises_is_recorded_and_the_others_kept(monkeypatch):
    """Under gpu-check's parts, a decode job that raises (the overlapped copies that never
    ran on a GPU, say) leaves the gates job's figures, and is named as a failed part."""

    def broken(*args, **kwargs):
        raise RuntimeError("copy stream lost")

    monkeypatch.setattr(runs, "decode_runs", broken)
    parts = check_parts.Parts("cpu", lambda line: None)
    report = paper_check.measure(
        "olmoe", TINY_MODELS["olmoe"], "cpu", PACE, 0, lambda line: None, parts.step
    )
    assert set(report["memory"]) == {"gates"} and "overlap" not in report
    assert parts.errors["paper olmoe decode"]["error"] == "RuntimeError: copy stream lost"
    assert set(parts.errors) == {"paper olmoe decode"}
