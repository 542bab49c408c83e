"""Every shipped config validates; every kind of bad config stops with one line naming the key."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml
from conftest import REPO, load_yaml, moecache, snakemake

from moecache import config as configs


def mutate(config: dict, dotted: str, value) -> dict:
    *parents, last = dotted.split(".")
    node = config
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return config


# (key to change, value, text the one-line error must contain)
BAD = [
    ("cache_size", 8, "cache_size"),
    ("harness.slots", 8, "harness.slots"),
    ("harness.capacity", "8", "harness.capacity"),
    ("corpus.heldout.sequences", 0, "corpus.heldout.sequences"),
    ("model.dtype", "float8", "model.dtype"),
    ("harness.device", "tpu", "harness.device"),
    ("harness.capacity", 17, "harness.capacity"),
    ("harness.capacity", 3, "harness.capacity"),
    ("harness.restricted_layers", [1, 3], "harness.restricted_layers"),
    ("model.architecture.num_experts_per_tok", 20, "model.architecture.num_experts_per_tok"),
    ("corpus.heldout.shards", {"a": 0, "b": 2}, "corpus.heldout.shards.b"),
    ("corpus.heldout.max_tokens", 129, "corpus.heldout.max_tokens"),
    # Cross-key rules the workflow relies on when it builds its DAG.
    ("harness.trace_run", "lru-1", "harness.trace_run: 'lru-1' is not a run"),
    ("harness.trace_run", "static", "harness.trace_run: 'static' restricts routing"),
    ("harness.runs.dwell-4.shards", ["b"], "harness.runs.dwell-4.multipliers"),
    ("harness.probe.window", 0, "harness.probe"),
    ("replay.capacities", [8, 17], "replay.capacities: capacity 17 is larger than experts"),
    ("replay.capacities", [3], "replay.capacities: top-k 4 is larger than capacity 3"),
    ("replay.capacities", [8, 8], "replay.capacities"),
    ("report.devices", ["../h200"], "report.devices"),
]


CONFIGS = sorted(path.name for path in (REPO / "config").glob("*.yaml"))


def test_every_config_is_tested():
    assert {"config.yaml", "olmoe.yaml", "rehearsal.yaml", "smoke.yaml"} <= set(CONFIGS)


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_configs_are_valid(name):
    configs.load(REPO / "config" / name)


@pytest.mark.parametrize(("key", "value", "named"), BAD)
def test_bad_config_names_the_key(smoke_config, key, value, named):
    with pytest.raises(configs.ConfigError) as caught:
        configs.validate(mutate(smoke_config, key, value))
    message = str(caught.value)
    assert named in message and "\n" not in message


@pytest.mark.parametrize("capacity", [64, 65])
def test_paper_capacity_at_or_above_experts_is_refused(capacity):
    config = configs.load(REPO / "config" / "olmoe.yaml")
    with pytest.raises(configs.ConfigError, match=f"capacity {capacity} must be below num_exp"):
        configs.validate(mutate(config, "harness.capacity", capacity))


@pytest.mark.pipeline
def test_snakemake_stops_before_any_job(tmp_path, smoke_config):
    """Every bad config of BAD through `snakemake -n` (side by side: each run spends most of
    its time starting Snakemake)."""

    def dry_run(case):
        i, (key, value, _) = case
        workdir = tmp_path / str(i)
        workdir.mkdir()
        bad = workdir / "bad.yaml"
        bad.write_text(yaml.safe_dump(mutate(copy.deepcopy(smoke_config), key, value)))
        return workdir, snakemake(workdir, "-n", "all", "--cores", "1", configfile=bad, check=False)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(dry_run, enumerate(BAD)))
    for (key, _, named), (workdir, result) in zip(BAD, results, strict=True):
        output = (result.stdout + result.stderr).strip().splitlines()
        assert result.returncode != 0, key
        assert len(output) == 1 and output[0].startswith("config error: "), output
        assert named in output[0], output[0]
        assert not (workdir / "results").exists()


def test_cli_validate_config(tmp_path, smoke_config):
    good = moecache("validate-config", str(REPO / "config" / "smoke.yaml"))
    assert good.returncode == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(mutate(smoke_config, "harness.capacity", 17)))
    result = moecache("validate-config", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "moecache: error: config key harness.capacity: capacity 17 must be below num_experts 16 "
        "(at C = N nothing is offloaded)"
    ]


def test_stage_settings_are_checked_against_the_schema():
    result = moecache(
        "corpus", "--settings", '{"seed": 0, "hub_offline": true}', "--out-dir", "unused"
    )
    assert result.returncode == 2
    assert "'corpus' is a required property" in result.stderr


def test_schema_file_is_the_one_the_package_reads():
    assert configs.schema() == load_yaml(REPO / "workflow" / "schemas" / "config.schema.yaml")
