"""harness.fan_out: `shard` decodes every run of a shard in one job, `run` one job per run x
multiplier x shard beside its reference; both write the same files with the same counts."""

from __future__ import annotations

import copy
import json
import random
import re

import pandas as pd
import pytest
from conftest import REPO, load_yaml, snakemake
from run_records import gates_record

from moecache import config as configs
from moecache.config import run_spec
from moecache.errors import MoecacheError
from moecache.harness import gates, jobs, runs
from moecache.model import tiny
from moecache.report.numbers import measured
from moecache.report.numbers.format import sig
from moecache.runs import RunName

# A few runs of every kind: the reference, a lossless rule, one that reads the trace run's
# demand and one that restricts routing, each at 1x and (but the reference) at 10x.
RUNS = {
    "all": run_spec("all", capacity=16, shards=["a"]),
    "lru": run_spec("lru", multipliers=[1, 10]),
    "farthest-future": run_spec("farthest-future", multipliers=[1, 10]),
    "dwell-4": run_spec("dwell", {"k": 4, "window": 8}, multipliers=[1, 10]),
}
COUNTS = ("timed_copies", "fills", "steady", "copy_groups", "scored", "timed_tokens")


def fanned(smoke_config, mode):
    runs_copy = copy.deepcopy(RUNS)
    smoke_config["harness"] |= {"fan_out": mode, "runs": runs_copy, "scaled_sequences": 2}
    return smoke_config


def dry_run_jobs(tmp_path, config) -> list[str]:
    """The jobs `snakemake all -n` lists, as "rule wildcards" lines."""
    configfile = tmp_path / "config.yaml"
    configfile.write_text(json.dumps(config))
    out = snakemake(tmp_path, "-n", "all", "--cores", "1", configfile=configfile).stdout
    # One block per job; a job without wildcards (profile_model) has no such line, so each
    # block is searched alone (a pattern spanning blocks took the next job's wildcards).
    blocks = re.split(r"^(?=(?:local)?rule \w+:$)", out, flags=re.MULTILINE)
    jobs = []
    for block in blocks:
        rule = re.match(r"(?:local)?rule (\w+):", block)
        wildcards = re.search(r"wildcards: (.*)", block)
        if rule and wildcards:
            jobs.append((rule.group(1), wildcards.group(1)))
    return jobs


@pytest.mark.pipeline
def test_a_run_fanned_out_dry_run_has_a_decode_job_per_run_multiplier_and_shard(tmp_path):
    config = load_yaml(REPO / "config" / "smoke.yaml")
    config["harness"]["fan_out"] = "run"
    jobs_listed = dry_run_jobs(tmp_path, config)
    decoded = sorted(w for rule, w in jobs_listed if rule == "decode")
    shards = list(config["corpus"]["heldout"]["shards"])
    expected = sorted(
        f"shard={shard}, label={RunName(name, m)}"
        for name, run in config["harness"]["runs"].items()
        for shard in run.get("shards", shards)
        for m in run.get("multipliers", [1])
        if m == 1 or shard == shards[0]
    )
    assert decoded == expected
    assert not [rule for rule, _ in jobs_listed if rule == "run_results"]


@pytest.mark.pipeline
def test_a_bad_fan_out_is_refused_in_one_line(tmp_path, smoke_config):
    smoke_config["harness"]["fan_out"] = "layer"
    with pytest.raises(configs.ConfigError) as error:
        configs.fan_out(smoke_config)
    assert str(error.value).splitlines() == [
        "config key harness.fan_out: 'layer' is not one of shard, run"
    ]
    with pytest.raises(configs.ConfigError, match="^config key harness.fan_out: 'layer' is not"):
        configs.validate_schema(smoke_config)
    configfile = tmp_path / "config.yaml"
    configfile.write_text(json.dumps(smoke_config))
    result = snakemake(tmp_path, "-n", "all", configfile=configfile, check=False)
    assert result.returncode != 0
    assert "config error: config key harness.fan_out: 'layer' is not one of" in result.stderr


def test_a_run_a_shard_does_not_decode_is_refused(smoke_config):
    settings = fanned(smoke_config, "run")
    with pytest.raises(MoecacheError, match="run lru at 10x: not decoded on shard b"):
        runs.runs_for_run(settings, "b", "a", "lru", 10)


def test_a_run_plans_its_reference_and_the_demand_it_reads(smoke_config):
    settings = fanned(smoke_config, "run")
    assert list(runs.runs_for_run(settings, "a", "a", "lru", 1)) == ["all-x1", "lru-x1"]
    assert list(runs.runs_for_run(settings, "a", "a", "all", 1)) == ["all-x1"]
    ff = runs.runs_for_run(settings, "b", "a", "farthest-future", 1)
    assert list(ff) == ["lru-x1", "all-x1", "farthest-future-x1"]
    scaled = runs.runs_for_run(settings, "a", "a", "farthest-future", 10)
    assert list(scaled) == ["lru-x1", "farthest-future-x10"]
    assert scaled["lru-x1"].limit == 2  # its demand is read on the scaled sequences only
    del settings["harness"]["runs"]["all"]  # no all-resident run: one of its own
    assert runs.runs_for_run(settings, "b", "a", "lru", 1)["all-resident-x1"].capacity == 16


@pytest.fixture(scope="module")
def model_and_sequences():
    """A seeded random model of the smoke config's sizes and a few random sequences: the
    counts compare the two modes, they need no trained model."""
    arch = load_yaml(REPO / "config" / "smoke.yaml")["model"]["architecture"]
    model = tiny.model("olmoe", arch, 512, seed=0)
    draw = random.Random(0)
    sequences = [[draw.randrange(512) for _ in range(24)] for _ in range(3)]
    return model, sequences


def decode_both(tmp_path, smoke_config, model_and_sequences) -> tuple[dict, dict]:
    """Shard a decoded in one job, and one job per run x multiplier: results and traces."""
    gates_file = tmp_path / "gates.json"
    gates_file.write_text(json.dumps(gates_record()))
    shard = fanned(smoke_config, "shard")
    jobs.run_decode(
        shard, None, None, "a", "a", gates_file, tmp_path / "shard", loaded=model_and_sequences
    )
    labels = list(runs.runs_for_shard(shard, "a", "a"))
    fanned_out = fanned(smoke_config, "run")
    for label in labels:
        jobs.run_decode(
            fanned_out,
            None,
            None,
            "a",
            "a",
            gates_file,
            tmp_path / "run",
            run=RunName.parse(label),
            trace_dir=tmp_path / "traces",
            loaded=model_and_sequences,
        )
    return {
        mode: {
            label: (
                json.loads((tmp_path / mode / f"{label}.json").read_text()),
                pd.read_parquet(
                    tmp_path / ("traces" if mode == "run" else mode) / f"{label}.parquet"
                ),
            )
            for label in labels
        }
        for mode in ("shard", "run")
    }.values()


# The decode stage's job (jobs.run_decode), once per shard and once per run: a pipeline test.
@pytest.mark.pipeline
def test_fanned_out_runs_count_what_the_shards_job_counts(
    tmp_path, smoke_config, model_and_sequences
):
    shard, run = decode_both(tmp_path, smoke_config, model_and_sequences)
    assert set(run) == set(shard) == {
        "all-x1", "lru-x1", "lru-x10", "farthest-future-x1", "farthest-future-x10",
        "dwell-4-x1", "dwell-4-x10",
    }  # fmt: skip
    for label, (one, trace_one) in shard.items():
        other, trace_other = run[label]
        rows = [[row[key] for key in COUNTS] for row in one["sequences"]]
        assert rows == [[row[key] for key in COUNTS] for row in other["sequences"]], label
        assert one["totals"]["nll"] == pytest.approx(
            other["totals"]["nll"], abs=gates.POOL_TOLERANCE
        )
        assert one["totals"]["delta_nll"] == pytest.approx(
            other["totals"]["delta_nll"], abs=gates.POOL_TOLERANCE
        )
        columns = ["sequence", "layer", "token", "copied"]
        copies = trace_one[columns].map(str).equals(trace_other[columns].map(str))
        assert copies, f"{label}: other copies per layer and token"
        assert other["fan_out"] == "run" and "fan_out" not in one
    results = {label: result for label, (result, _) in run.items()}
    assert results["lru-x1"]["interleaved_with"] == ["all-x1"]
    reference = results["lru-x1"]["reference"]
    assert reference["run"] == "all-x1"
    assert [row["sequence"] for row in reference["sequences"]] == [0, 1, 2]
    assert results["all-x1"]["reference"] is None and results["lru-x10"]["reference"] is None
    assert results["lru-x10"]["interleaved_with"] == ["lru-twin-x1"]
    twins = [
        r["twin_1x"]["totals"]["timed_copies"] for r in (shard["lru-x10"][0], results["lru-x10"])
    ]
    assert twins[0] == twins[1] > 0
    # The numbers compare LRU with the all-resident run its own job decoded beside it.
    files = [tmp_path / "run" / f"{label}.json" for label in ("lru-x1", "all-x1")]
    text = measured.runs_section(tmp_path, "a", files)
    lru, resident = (r["totals"]["tokens_per_second"] for r in (results["lru-x1"], reference))
    assert f"LRU decodes {sig(100 * (1 - lru / resident))}% fewer tokens/s" in text


def test_the_decode_command_names_one_run_with_run_and_multiplier():
    from argparse import Namespace

    from moecache.cli.harness import one_run

    assert one_run(Namespace(run=None, multiplier=None)) is None
    assert one_run(Namespace(run="lru", multiplier=None)) == RunName("lru")
    assert one_run(Namespace(run="lru", multiplier=10)) == RunName("lru", 10)
    with pytest.raises(MoecacheError, match="^--multiplier: give --run too$"):
        one_run(Namespace(run=None, multiplier=10))
