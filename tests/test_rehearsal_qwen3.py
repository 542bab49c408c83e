"""The paper's pretrained path on another family: config/rehearsal-qwen3.yaml runs the whole
`all` target on a tiny Qwen3-MoE checkpoint in the hub's layout (layer 0 dense, as
`mlp_only_layers: [0]` makes it) and a local text file, on a CPU with no network."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import BIN, REPO, env, load_yaml, snakemake

sys.path.insert(0, str(REPO / "tests" / "rehearsal"))
import build as rehearsal  # noqa: E402

from moecache.harness.gates import POOL_TOLERANCE  # noqa: E402
from moecache.records.accuracy import AccuracySummary
from moecache.records.gates import GatesResult
from moecache.records.io import read_dict
from moecache.records.learned import LearnedEvaluation
from moecache.records.profile import ProbeResult, ProfileResult

REHEARSAL = REPO / "config" / "rehearsal-qwen3.yaml"
MOE_LAYERS = [1, 2, 3]  # of the tiny model's 4: layer 0 is dense


@pytest.fixture(scope="module")
def qwen3_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("rehearsal-qwen3")
    rehearsal.build(workdir / "rehearsal", REHEARSAL)
    snakemake(workdir, "all", "--cores", "1", "--resources", "gpu=1", configfile=REHEARSAL)
    return workdir


def test_the_checkpoint_is_a_qwen3_moe_in_the_hubs_layout(qwen3_run):
    from safetensors import safe_open

    config = load_yaml(REHEARSAL)
    source = qwen3_run / config["model"]["source"]
    saved = json.loads((source / "config.json").read_text())
    assert saved["model_type"] == "qwen3_moe" and saved["mlp_only_layers"] == [0]
    with safe_open(source / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
    e = config["model"]["architecture"]["num_experts"]
    for layer in config["harness"]["restricted_layers"]:
        for proj in ("gate_proj", "up_proj", "down_proj"):
            assert f"model.layers.{layer}.mlp.experts.{e - 1}.{proj}.weight" in names
    # Layer 0 is a dense MLP, with no experts.
    assert "model.layers.0.mlp.gate_proj.weight" in names
    assert not any(name.startswith("model.layers.0.mlp.experts.") for name in names)


def test_the_run_went_through_the_qwen3_adapter(qwen3_run):
    # Every harness job loads the checkpoint refusing any other model_type than the
    # config's family; the decode job's plan line reads the family from the checkpoint.
    log = (qwen3_run / "logs/decode/a.log").read_text().splitlines()
    plan = [line for line in log if line.startswith("plan: ")]
    assert plan and plan[0].startswith("plan: rehearsal/Qwen3-MoE-tiny (qwen3_moe, float32)")
    run = json.loads((qwen3_run / "results/runs/a/lru-x10.json").read_text())
    assert run["settings"]["model"]["family"] == "qwen3_moe"
    assert run["totals"]["steady_copies"] > 0 and run["multiplier"] == 10
    # Per-layer results cover the MoE layers only.
    profile = read_dict(qwen3_run / "results/profile/model.json", ProfileResult)
    assert len(profile["reuse_per_layer"]) == len(MOE_LAYERS)
    probe = read_dict(qwen3_run / "results/probe/a.json", ProbeResult)
    assert [row["layer"] for row in probe["layers"]] == MOE_LAYERS
    for shard in load_yaml(REHEARSAL)["corpus"]["heldout"]["shards"]:
        gates = read_dict(qwen3_run / f"results/gates/{shard}.json", GatesResult)
        assert gates["failures"] == []


def test_every_stage_ran_on_the_checkpoint(qwen3_run):
    config = load_yaml(REHEARSAL)
    assert not (qwen3_run / "results/model").exists()
    evaluation = read_dict(qwen3_run / "results/learned/evaluation.json", LearnedEvaluation)
    assert evaluation["shards"]["a"]["closed_loop"]["router/linear"]["matches_replay"] is True
    # Router tuning: LoRA on Qwen3-MoE's router, experts and attention, merged back into a
    # Qwen3-MoE checkpoint and measured.
    for variant in ("sft", "hit", "tag", "harness"):
        merged = qwen3_run / f"results/router_tuning/{variant}/model"
        assert json.loads((merged / "config.json").read_text())["model_type"] == "qwen3_moe"
        measured = qwen3_run / f"results/router_tuning/measured/{variant}.json"
        assert json.loads(measured.read_text())["source"].endswith(f"{variant}/model")
    controller = json.loads((qwen3_run / "results/runs/a/controller-t50-x1.json").read_text())
    assert controller["policy"] == "controller" and controller["totals"]["timed_tokens"] > 0
    for task in config["accuracy"]["tasks"]:
        summary = read_dict(qwen3_run / f"results/accuracy/{task}/summary.json", AccuracySummary)
        assert summary["rows"][0]["row"] == "free" and len(summary["rows"]) == 5


def test_every_table_and_figure_is_built(qwen3_run):
    result = snakemake(qwen3_run, "all", "-n", configfile=REHEARSAL)
    assert "Nothing to be done" in result.stdout + result.stderr
    for name in (
        "table1.md",
        "table2.md",
        "table3.md",
        "table_eviction.md",
        "table_bounds.md",
        "table_controller.md",
        "fig1.pdf",
        "fig2.pdf",
        "claims.md",
    ):
        assert (qwen3_run / "figures" / name).stat().st_size > 0, name


@pytest.mark.parametrize("label", ["farthest-future-x1", "lru-x10", "dwell-4-x1"])
def test_a_fanned_out_decode_job_counts_what_the_shards_job_counted(qwen3_run, tmp_path, label):
    """The rehearsal decodes shard a in one job (harness.fan_out shard); `moecache decode
    --run` (fan_out run, as the rule calls it) decodes one run beside its reference and
    makes the same copies, with the same NLL."""
    shard = json.loads((qwen3_run / f"results/runs/a/{label}.json").read_text())
    settings = shard["settings"]
    settings["harness"]["fan_out"] = "run"
    name, multiplier = label.rsplit("-x", 1)
    command = [str(BIN / "moecache"), "decode", "--settings", json.dumps(settings)]
    command += ["--model", settings["model"]["source"], "--shard", "a", "--first-shard", "a"]
    command += ["--sequences", "results/heldout/a.parquet", "--gates", "results/gates/a.json"]
    command += ["--run", name, "--multiplier", multiplier]
    command += ["--out-dir", str(tmp_path / "runs"), "--trace-dir", str(tmp_path / "traces")]
    done = subprocess.run(command, cwd=qwen3_run, capture_output=True, text=True, env=env())
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [f"{label}.json"]
    assert (tmp_path / "traces" / f"{label}.parquet").is_file()
    run = json.loads((tmp_path / "runs" / f"{label}.json").read_text())
    counts = ("timed_copies", "fills", "steady", "copy_groups", "timed_tokens")
    assert [[r[k] for k in counts] for r in run["sequences"]] == [
        [r[k] for k in counts] for r in shard["sequences"]
    ]
    assert run["totals"]["nll"] == pytest.approx(shard["totals"]["nll"], abs=POOL_TOLERANCE)
    # A 1x run's reference is the all-resident run; a scaled run's is its 1x twin.
    expected = "all-x1" if multiplier == "1" else None
    assert (run["reference"] or {}).get("run") == expected
