"""The paper-scale configs of each family (config/olmoe.yaml and the ones beside it) match
their published checkpoints, build their DAG with the stages their family can run, and
`moecache plan` sizes them from the published config alone. (Every config in config/
validates in tests/test_config.py and lists its whole DAG, locally and through the SLURM
profile, in tests/test_paper_settings.py.)"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml
from conftest import REPO, load_yaml, moecache, snakemake

from moecache.model import registry
from moecache.plan import RESERVE_GIB
from moecache.schedule import accountant

MIB = 2**20


def gpt_oss_expert(h: int, i: int) -> int:
    """One GPT-OSS expert: gate_up [H, 2I] and down [I, H], each with its bias."""
    return 2 * h * i + 2 * i + i * h + h


# config -> (family, hub id, one routed expert's parameters, stages it leaves out)
PAPER = {
    "olmoe.yaml": ("olmoe", "allenai/OLMoE-1B-7B-0125", 3 * 2048 * 1024, set()),
    "qwen3-30b-a3b.yaml": ("qwen3_moe", "Qwen/Qwen3-30B-A3B", 3 * 2048 * 768, set()),
    "mixtral-8x7b.yaml": (
        "mixtral",
        "mistralai/Mixtral-8x7B-Instruct-v0.1",
        3 * 4096 * 14336,
        set(),
    ),
    "deepseek-v2-lite.yaml": (
        "deepseek_v2",
        "deepseek-ai/DeepSeek-V2-Lite",
        3 * 2048 * 1408,
        {"router_tuning"},
    ),
    "gpt-oss-20b.yaml": (
        "gpt_oss",
        "openai/gpt-oss-20b",
        gpt_oss_expert(2880, 2880),
        {"router_tuning", "controller", "accuracy"},
    ),
}
OLMOE_EXPERT_BYTES = PAPER["olmoe.yaml"][2] * 2  # bfloat16: 12 MiB
# Experts the hub ships quantized, planned as stored (docs/quantized.md): gpt-oss-20b's
# MXFP4 weights at 17/32 of a byte (FP4 and one e8m0 exponent per 32), biases in bfloat16.
STORED_EXPERT_BYTES = {"gpt-oss-20b.yaml": 3 * 2880 * 2880 * 17 // 32 + 3 * 2880 * 2}
# The jobs of each stage a family may leave out.
STAGE_JOBS = {
    "router_tuning": ("router_train", "router_measure"),
    "controller": ("controller_train", "controller_sweep", "controller_longer"),
    "accuracy": ("accuracy_task", "accuracy"),
}


def test_every_paper_config_is_here():
    shipped = {path.name for path in (REPO / "config").glob("*.yaml")}
    assert set(PAPER) <= shipped
    assert OLMOE_EXPERT_BYTES == 12 * MIB


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_config_matches_its_published_checkpoint(name):
    family, source, _, left_out = PAPER[name]
    config = load_yaml(REPO / "config" / name)
    assert config["model"]["source"] == source
    assert config["model"].get("family", "olmoe") == family
    published = accountant.checkpoint_config(config)
    assert published.model_type == family
    sizes = registry.adapter_for(family).sizes(published)
    arch = config["model"]["architecture"]
    for key in (
        "hidden_size",
        "intermediate_size",  # one routed expert's, whatever the family calls it
        "num_hidden_layers",
        "num_attention_heads",
        "num_experts",
        "num_experts_per_tok",
    ):
        assert arch[key] == getattr(sizes, key), key
    assert arch["max_position_embeddings"] == published.max_position_embeddings
    # Half the MoE layers, spread evenly (no two adjacent), never a dense one; C = N/2.
    layers = config["harness"]["restricted_layers"]
    assert set(layers) <= set(sizes.moe_layers)
    assert len(layers) == len(sizes.moe_layers) // 2 or name == "olmoe.yaml"
    if name != "olmoe.yaml":  # the paper's own choice: layers 4-8 and 11-13
        assert all(b - a == 2 for a, b in zip(layers, layers[1:], strict=False))
    capacity = config["harness"]["capacity"]
    assert capacity == sizes.num_experts // 2 >= sizes.num_experts_per_tok
    assert config["harness"]["runs"]["all"]["capacity"] == sizes.num_experts
    assert config["replay"]["capacities"] == [capacity]  # the scorecard at the paper's ratio
    for stage in ("router_tuning", "controller", "accuracy"):
        assert (stage in config) == (stage not in left_out), stage
    if "router_tuning" in config:
        assert config["router_tuning"]["layer"] in layers
    bench = config["replay"]["benchmark"]
    assert (bench["layers"], bench["experts"], bench["top_k"], bench["capacity"]) == (
        len(layers),
        sizes.num_experts,
        sizes.num_experts_per_tok,
        capacity,
    )


def planned_jobs(output: str) -> dict[str, int]:
    table = output.split("Job stats:")[1].split("total")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)}


@pytest.mark.pipeline
def test_paper_configs_build_their_dag_with_the_stages_their_family_runs(tmp_path):
    """The dry runs side by side (the SLURM profile's are in test_paper_settings.py)."""

    def dry_run(name):
        workdir = tmp_path / name
        workdir.mkdir()
        return snakemake(workdir, "all", "-n", configfile=REPO / "config" / name)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(dry_run, sorted(PAPER)))
    for where, result in zip(sorted(PAPER), results, strict=True):
        jobs = planned_jobs(result.stdout)
        left_out = PAPER[where][3]
        # Pretrained: nothing trained, both shards decoded (in one job each, or fanned out
        # over runs and multipliers: test_paper_settings.py counts them).
        fanned = load_yaml(REPO / "config" / where)["harness"].get("fan_out") == "run"
        assert "train" not in jobs and (jobs["decode"] > 2 if fanned else jobs["decode"] == 2), (
            where
        )
        for stage, rules in STAGE_JOBS.items():
            for rule in rules:
                assert (rule in jobs) == (stage not in left_out), f"{where}: {rule}"


def test_plan_sizes_each_paper_config_from_its_published_config(tmp_path):
    """`moecache plan --gpu-gib 80` on each paper-scale config: the config's own run (one
    expert's bytes as published or as stored, every routed expert of the offloaded layers pinned
    on the host) fits an 80 GiB GPU, and the largest C with every MoE layer offloaded fits."""

    def run(name):
        out = tmp_path / f"{name}.json"
        return moecache(
            "plan",
            "--configfile",
            str(REPO / "config" / name),
            "--gpu-gib",
            "80",
            "--out",
            str(out),
        ), out

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(sorted(PAPER), pool.map(run, sorted(PAPER)), strict=True))
    for name, (result, out) in results.items():
        family, source, expert_params, _ = PAPER[name]
        assert result.returncode == 0, f"{name}: {result.stderr}"
        lines = result.stdout.splitlines()
        assert lines[0].startswith(f"fit: {source} ({family}, bfloat16)"), lines[0]
        answer = json.loads(out.read_text())
        report = answer["config_run"]
        config = load_yaml(REPO / "config" / name)
        layers = config["harness"]["restricted_layers"]
        experts = config["model"]["architecture"]["num_experts"]
        expert_bytes = STORED_EXPERT_BYTES.get(name, expert_params * 2)
        assert report["expert_bytes"] == expert_bytes, name
        assert f"(one expert {expert_bytes / MIB:.2f} MiB)" in lines[1]
        assert report["pinned_host_bytes"] == report["expert_bytes"] * experts * len(layers)
        assert report["slot_bytes"] == report["expert_bytes"] * report["capacity"] * len(layers)
        # The config's own study: its jobs' peak (the reference, scaled twins, the ring)
        # against the GPU, said as the figures say.
        fits = report["device_peak_bytes"] <= (80 - RESERVE_GIB) * 2**30
        assert report["fits"] is fits and lines[-1].endswith(", fits" if fits else "NOT fit")
        # Every MoE layer offloaded at the chosen C, which fits.
        sizes = registry.adapter_for(family).sizes(accountant.checkpoint_config(config))
        assert answer["offloaded_layers"] == list(sizes.moe_layers), name
        assert answer["device_peak_bytes"] <= 80 * 2**30, name
        assert answer["host_peak_bytes"] == answer["expert_bytes"] * experts * len(sizes.moe_layers)
    deepseek = json.loads(results["deepseek-v2-lite.yaml"][1].read_text())["config_run"]
    # Two shared experts in each of the 26 MoE layers, on the device, never offloaded.
    assert deepseek["shared_expert_bytes"] == 26 * 2 * PAPER["deepseek-v2-lite.yaml"][2] * 2
    olmoe = json.loads(results["olmoe.yaml"][1].read_text())["config_run"]
    assert olmoe["expert_bytes"] == OLMOE_EXPERT_BYTES and olmoe["shared_expert_bytes"] == 0


def test_plan_refuses_a_dense_restricted_layer(tmp_path):
    config = load_yaml(REPO / "config" / "deepseek-v2-lite.yaml")
    config["harness"]["restricted_layers"] = [0, 2, 4]
    bad = tmp_path / "dense.yaml"
    bad.write_text(yaml.safe_dump(config))
    result = moecache("plan", "--configfile", str(bad), "--gpu-gib", "80")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "moecache: error: harness.restricted_layers: layer 0 of this deepseek_v2 model "
        "is dense, not an MoE layer (MoE layers: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, "
        "14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26])"
    ]
