"""The smoke config through Snakemake: every stage's output exists and holds what it should."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, SMOKE, load_yaml, snakemake
from snakemake.api import SnakemakeApi
from snakemake.settings.types import (
    ConfigSettings,
    DAGSettings,
    OutputSettings,
    Quietness,
    ResourceSettings,
)

from moecache.data import tokenizer
from moecache.model import checkpoint
from moecache.records.io import read_dict
from moecache.records.profile import ProfileResult
from moecache.records.training import ModelTraining

pytestmark = pytest.mark.pipeline  # every test here runs Snakemake or builds its DAG


def test_dry_run_lists_the_dag(tmp_path):
    result = snakemake(tmp_path, "-n", "all", "--cores", "1")
    for rule in ("corpus", "tokenizer", "heldout", "train", "profile_model", "all"):
        assert f"rule {rule}:" in result.stdout
    assert not (tmp_path / "results").exists()


def test_a_device_without_its_gpu_check_stops_before_any_job(tmp_path, smoke_config):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**smoke_config, "report": {"devices": ["h100"]}}))
    result = snakemake(tmp_path, "-n", "all", "--cores", "1", configfile=config, check=False)
    assert result.returncode != 0
    assert (result.stdout + result.stderr).strip().splitlines() == [
        "config error: config key report.devices: no GPU check measured/gpu-check/h100.json"
    ]


def test_heldout_shards(smoke_run):
    heldout = load_yaml(SMOKE)["corpus"]["heldout"]
    shards = {
        name: pd.read_parquet(smoke_run / f"results/heldout/{name}.parquet")
        for name in heldout["shards"]
    }
    for frame in shards.values():
        assert len(frame) == heldout["sequences"]
        assert frame["tokens"].between(2, heldout["max_tokens"]).all()
        assert (frame["tokens"] == frame["input_ids"].map(len)).all()
    a, b = shards.values()
    assert not set(a["id"]) & set(b["id"])
    train = pd.read_parquet(smoke_run / "results/corpus/train.parquet")
    assert not set(train["id"]) & (set(a["id"]) | set(b["id"]))


def test_trained_model_and_tokenizer_load(smoke_run):
    config = load_yaml(SMOKE)
    tok = tokenizer.load(smoke_run / "results/tokenizer")
    assert len(tok) == config["tokenizer"]["vocab_size"]
    model = checkpoint.load(
        smoke_run / "results/model", "float32", "cpu", config["model"]["architecture"]
    )
    assert model.config.num_experts == config["model"]["architecture"]["num_experts"]
    log = read_dict(smoke_run / "results/model/training.json", ModelTraining)["log"]
    assert len(log) == config["training"]["steps"]
    assert log[-1]["lm_loss"] < log[0]["lm_loss"]


def test_profile_measures_copy_and_token(smoke_run):
    profile = read_dict(smoke_run / "results/profile/model.json", ProfileResult)
    arch = load_yaml(SMOKE)["model"]["architecture"]
    assert profile["expert_bytes"] == 3 * arch["hidden_size"] * arch["intermediate_size"] * 4
    assert profile["expert_copy_ms"] > 0 and profile["token_compute_ms"] > 0
    assert len(profile["reuse_per_layer"]) == arch["num_hidden_layers"]


def dag_jobs(workdir: Path, configfile: Path) -> list:
    """Every job of the target `all`'s DAG in a fresh `workdir`, from Snakemake's API (the
    DAG it would run, not the text of a dry run)."""
    settings = OutputSettings(quiet={Quietness.ALL})
    with SnakemakeApi(settings) as api:
        workflow_api = api.workflow(
            resource_settings=ResourceSettings(cores=1),
            config_settings=ConfigSettings(configfiles=[configfile]),
            snakefile=REPO / "Snakefile",
            workdir=workdir,
        )
        workflow = workflow_api.dag(DAGSettings(targets={"all"})).workflow_api._workflow
        # Snakemake's API prints a DAG but does not return one: its own two steps.
        workflow._prepare_dag(forceall=False, ignore_incomplete=True, lock_warn_only=True)
        workflow._build_dag()
        return list(workflow.dag.jobs)


@pytest.mark.parametrize(
    "configfile", [SMOKE, REPO / "config" / "config.yaml"], ids=["smoke", "default"]
)
def test_every_job_logged_and_benchmarked(tmp_path, configfile):
    # The committed GPU check that the default's report.devices names.
    (tmp_path / "measured").symlink_to(REPO / "measured")
    jobs = [job for job in dag_jobs(tmp_path, configfile) if job.rule.name != "all"]
    assert len({job.rule.name for job in jobs}) > 30
    unlogged = [str(job) for job in jobs if not job.log]
    unbenchmarked = [str(job) for job in jobs if not job.benchmark]
    assert unlogged == [] and unbenchmarked == []
    # `make run` leaves tracked files alone: whatever a job writes, git ignores.
    written = sorted({str(p) for job in jobs for p in [*job.output, *job.log, job.benchmark]})
    ignored = subprocess.run(
        ["git", "check-ignore", "--stdin"],
        input="\n".join(written),
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert sorted(set(written) - set(ignored)) == []


def test_second_run_has_nothing_to_do(smoke_run):
    result = snakemake(smoke_run, "-n", "all", "--cores", "1")
    assert "Nothing to be done" in result.stdout + result.stderr


def test_the_smoke_run_draws_the_overlap_figure_and_states_its_verdicts(smoke_run):
    """The smoke config's overlapped runs (lru-pregate at 1x and 10x, farthest-future-oracle
    at 1x) reach the overlap figure and the numbers' overlap section."""
    for suffix in ("pdf", "png"):
        assert (smoke_run / f"figures/fig_overlap.{suffix}").stat().st_size > 0
    sources = json.loads((smoke_run / "figures/fig_overlap.sources.json").read_text())
    drawn = {(entry.get("run"), entry.get("multiplier")) for entry in sources["inputs"]}
    assert {("lru-pregate", 1), ("lru-pregate", 10), ("farthest-future-oracle", 1)} <= drawn
    text = (smoke_run / "figures/numbers.md").read_text()
    assert "farthest-future's advantage over LRU survives overlap at 1x: yes" in text or (
        "farthest-future's advantage over LRU survives overlap at 1x: no" in text
    )
    assert "survives overlap at 10x: not measured (no overlapped farthest-future run" in text
