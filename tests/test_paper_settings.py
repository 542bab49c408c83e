"""The paper's settings build their DAG, and their pretrained path runs end to end on the
rehearsal config: a tiny OLMoE checkpoint in the hub's layout and a local text file, on a
CPU with no network."""

from __future__ import annotations

import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest
from conftest import REPO, load_yaml, snakemake

sys.path.insert(0, str(REPO / "tests" / "rehearsal"))
import build as rehearsal  # noqa: E402

from moecache.records.accuracy import AccuracySummary
from moecache.records.gates import GatesResult
from moecache.records.io import read_dict
from moecache.records.learned import LearnedEvaluation

# Every config with a model (config/trace.yaml, a study from a trace alone, is
# tests/test_trace_study.py's).
CONFIGS = sorted(p for p in (REPO / "config").glob("*.yaml") if "model" in load_yaml(p))
SLURM = ("--workflow-profile", str(REPO / "workflow/profiles/slurm"))
REHEARSAL = REPO / "config" / "rehearsal.yaml"


def planned_jobs(output: str) -> dict[str, int]:
    """The job counts of a dry run's 'Job stats' table."""
    table = output.split("Job stats:")[1].split("total")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)}


def expected_decodes(config: dict) -> int:
    shards = list(config["corpus"]["heldout"]["shards"])
    return sum(
        1
        for run in config["harness"]["runs"].values()
        for shard in run.get("shards", shards)
        for m in run.get("multipliers", [1])
        if m == 1 or shard == shards[0]
    )


@pytest.mark.pipeline
def test_every_config_lists_its_whole_dag(tmp_path):
    """Every config in config/, locally and through the SLURM profile (the dry runs side by
    side: each spends most of its time starting Snakemake)."""
    cases = [(path, profile) for path in CONFIGS for profile in ((), SLURM)]

    def dry_run(case):
        path, profile = case
        workdir = tmp_path / f"{path.stem}-{len(profile)}"
        workdir.mkdir()
        # The GPU checks a config names (report.devices) are committed under measured/.
        (workdir / "measured").symlink_to(REPO / "measured")
        return workdir, snakemake(workdir, "all", "-n", *profile, configfile=path)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(dry_run, cases))
    for (path, profile), (workdir, result) in zip(cases, results, strict=True):
        where = f"{path.name}{' through the SLURM profile' if profile else ''}"
        jobs = planned_jobs(result.stdout)
        config = load_yaml(path)
        pretrained = config["model"]["source"] != "embedded"
        assert ("train" in jobs) != pretrained and ("tokenizer" in jobs) != pretrained, where
        # One results file a run, shard and multiplier: from one interleaved decode job a
        # shard, or from a decode job of its own (harness.fan_out run).
        if config["harness"].get("fan_out") == "run":
            assert "run_results" not in jobs and jobs["decode"] == expected_decodes(config)
        else:
            assert jobs["run_results"] == expected_decodes(config), where
            assert jobs["decode"] == len(config["corpus"]["heldout"]["shards"]), where
        rules = ("corpus", "heldout", "gates", "replay", "bound", "table1", "fig1", "fig2")
        for rule in (*rules, "claims"):
            assert rule in jobs, f"{where}: no {rule} job"
        # Replay, bounds and foresight at each capacity beside the trace run's own.
        harness = config["harness"]
        own = harness["runs"][harness["trace_run"]].get("capacity", harness["capacity"])
        others = len(set(config["replay"].get("capacities", [])) - {own})
        assert jobs.get("bound_at_capacity", 0) == others * jobs["bound"], where
        assert not (workdir / "results").exists()


@pytest.mark.pipeline
def test_paper_dag_has_every_run_shard_and_multiplier(tmp_path):
    result = snakemake(tmp_path, "all", "-n", configfile=REPO / "config/olmoe.yaml")
    jobs = planned_jobs(result.stdout)
    # 12 runs as in the paper's Table 1 (8 at three multipliers), and the controller at two
    # thresholds, at three multipliers.
    # One decode job a run, shard and multiplier (harness.fan_out run): 34, and the four
    # overlapped runs at three multipliers each; one batched job a run, B and shape.
    assert jobs["decode"] == 34 + 4 * 3 and "run_results" not in jobs
    assert jobs["decode_batched"] == 5 * 5 * 3 and jobs["replay_batched"] == 5 * 2
    assert jobs["heldout"] == 2 and jobs["gates"] == 2
    # The controller: 2 objectives x 3 seeds + 4 prices; 6 thresholds x 3 multipliers + the
    # compared runs at each; the longer sequences once.
    assert jobs["controller_train"] == 10 and jobs["controller_sweep"] == 21
    assert jobs["controller_longer"] == 1
    # Table 2: the hub's MMLU and the documentation task, every row on each.
    assert jobs["accuracy_task"] == 2 and jobs["accuracy"] == 2 and jobs["table2"] == 1
    for target in (
        "results/runs/a/lru-x50.json",
        "results/runs/b/dwell-64-x1.json",
        "results/runs/a/lru-overlap-x50.json",
        "results/batched/a/b16-continuous-p0/dwell-16.json",
    ):
        assert target in result.stdout


@pytest.fixture(scope="module")
def rehearsal_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("rehearsal")
    rehearsal.build(workdir / "rehearsal")
    snakemake(workdir, "all", "--cores", "1", "--resources", "gpu=1", configfile=REHEARSAL)
    return workdir


def test_rehearsal_checkpoint_has_the_hub_layout(rehearsal_run):
    from safetensors import safe_open

    config = load_yaml(REHEARSAL)
    source = rehearsal_run / config["model"]["source"]
    with safe_open(source / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
    e = config["model"]["architecture"]["num_experts"]
    for layer in config["harness"]["restricted_layers"]:
        for proj in ("gate_proj", "up_proj", "down_proj"):
            assert f"model.layers.{layer}.mlp.experts.{e - 1}.{proj}.weight" in names
    assert json.loads((source / "config.json").read_text())["model_type"] == "olmoe"


def test_rehearsal_runs_the_pretrained_path(rehearsal_run):
    config = load_yaml(REHEARSAL)
    # Nothing trained here: the checkpoint and its tokenizer are used as they are.
    assert not (rehearsal_run / "results/model").exists()
    assert not (rehearsal_run / "results/tokenizer").exists()
    # Held-out text from the local dataset, tokenized by the checkpoint's own tokenizer:
    # no BOS token, so every document starts at the end-of-text token, as OLMoE's do.
    texts = [json.loads(line)["text"] for line in (rehearsal_run / "rehearsal/text.jsonl").open()]
    corpus = pd.read_parquet(rehearsal_run / "results/corpus/shard-a.parquet")
    heldout_docs = config["corpus"]["heldout"]["sequences"]
    assert list(corpus["text"]) == texts[:heldout_docs]
    # The training part: just the learned eviction rules' trace documents, after the shards.
    train = pd.read_parquet(rehearsal_run / "results/corpus/train.parquet")
    end = max(config["corpus"]["heldout"]["shards"].values()) + heldout_docs
    assert list(train["text"]) == texts[end : end + config["corpus"]["trace_sequences"]]
    evaluation = read_dict(rehearsal_run / "results/learned/evaluation.json", LearnedEvaluation)
    loop = evaluation["shards"]["a"]["closed_loop"]["router/linear"]
    assert loop["matches_replay"] is True
    heldout = pd.read_parquet(rehearsal_run / "results/heldout/a.parquet")
    tok = json.loads((rehearsal_run / config["model"]["source"] / "tokenizer.json").read_text())
    eos = next(t["id"] for t in tok["added_tokens"] if t["content"] == rehearsal.EOS)
    assert all(ids[0] == eos for ids in heldout["input_ids"])
    for shard in config["corpus"]["heldout"]["shards"]:
        gates = read_dict(rehearsal_run / f"results/gates/{shard}.json", GatesResult)
        assert gates["failures"] == []
    run = json.loads((rehearsal_run / "results/runs/a/lru-x10.json").read_text())
    assert run["totals"]["steady_copies"] > 0 and run["multiplier"] == 10
    # The router stage from the checkpoint: fine-tuned, merged into safetensors, measured.
    for variant in ("sft", "hit", "tag", "harness"):
        merged = rehearsal_run / f"results/router_tuning/{variant}/model"
        assert (merged / "model.safetensors").exists()
        assert not list(merged.glob("*.bin")) and not list(merged.glob("*.pt"))
        measured = rehearsal_run / f"results/router_tuning/measured/{variant}.json"
        assert json.loads(measured.read_text())["source"].endswith(f"{variant}/model")
    # The controller's heads over the checkpoint, decoded beside the other runs.
    assert (rehearsal_run / "results/controller/heads/differentiable-s0.safetensors").exists()
    controller = json.loads((rehearsal_run / "results/runs/a/controller-t50-x1.json").read_text())
    assert controller["policy"] == "controller" and controller["totals"]["timed_tokens"] > 0
    # Table 2's rows through lm-eval on the checkpoint and its own tokenizer.
    for task in config["accuracy"]["tasks"]:
        summary = read_dict(
            rehearsal_run / f"results/accuracy/{task}/summary.json", AccuracySummary
        )
        assert summary["rows"][0]["row"] == "free" and len(summary["rows"]) == 5


def test_rehearsal_builds_every_table_and_figure(rehearsal_run):
    result = snakemake(rehearsal_run, "all", "-n", configfile=REHEARSAL)
    assert "Nothing to be done" in result.stdout + result.stderr
    names = ("table1.md", "table_eviction.md", "table_bounds.md", "fig1.pdf", "fig2.pdf")
    for name in (*names, "claims.md"):
        assert (rehearsal_run / "figures" / name).stat().st_size > 0
    # The scorecard fills the rows it can: replay, bounds, the learned scorers, Table 3.
    scorecard = pd.read_csv(rehearsal_run / "figures/claims.csv", keep_default_na=False)
    answered = set(scorecard.loc[scorecard["verdict"] != "not run", "key"])
    assert {"ff_vs_lru", "ff_vs_bstar", "mean_interval_literal", "router_copies"} <= answered
    sources = json.loads((rehearsal_run / "figures/table1.sources.json").read_text())
    assert all(source["sha256"] for source in sources["inputs"])
