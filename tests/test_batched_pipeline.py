"""Batched decoding in the pipeline: shape names, the config's batched section, the decode
job's plan and cut, both fan-out modes writing the same counts, a job per run x batch size
x shape in the paper settings' DAG, and the verdicts derived from batched results."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
from conftest import REPO, load_yaml, snakemake
from run_records import gates_record

from moecache import config as configs
from moecache.config import run_spec
from moecache.errors import MoecacheError
from moecache.harness import batched_runs, jobs
from moecache.harness import decode as harness_decode
from moecache.model import tiny
from moecache.records import trace
from moecache.report import batching
from moecache.runs import BatchShape, NameFormatError, batch_shapes

SHAPES = {"batching": ["static", "continuous"], "prefill": [0, 8]}


def test_a_shape_name_round_trips_and_a_bad_one_is_refused():
    shape = BatchShape(4, "continuous", 0)
    assert str(shape) == "b4-continuous-p0"
    assert BatchShape.parse(str(shape)) == shape
    with pytest.raises(NameFormatError, match="'b4-dynamic-p0' is not a batch shape name"):
        BatchShape.parse("b4-dynamic-p0")


def test_continuous_batching_has_no_prefill_shape():
    assert [str(s) for s in batch_shapes([2], SHAPES)] == [
        "b2-static-p0",
        "b2-static-p8",
        "b2-continuous-p0",
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda h: h["batched"].update(runs=["lru", "nope"]),
            "config key harness.batched.runs: 'nope' is not a run of harness.runs",
        ),
        (
            lambda h: h["batched"].update(runs=["router-logit"]),
            "config key harness.batched.runs: 'router-logit' reads the router",
        ),
        (
            lambda h: h.pop("batched"),
            "config key harness.batched: give harness.batch_sizes and harness.batched together",
        ),
        (
            lambda h: h["batched"].update(sequences=99),
            "config key harness.batched.sequences: 99 is more than the 4 sequences",
        ),
    ],
)
def test_a_bad_batched_section_is_refused_in_one_line(smoke_config, change, message):
    change(smoke_config["harness"])
    with pytest.raises(configs.ConfigError) as error:
        configs.check(smoke_config)
    assert len(str(error.value).splitlines()) == 1
    assert str(error.value).startswith(message)


def test_the_plan_refuses_what_the_config_does_not_batch(smoke_config):
    assert [str(s) for s, _ in batched_runs.to_decode(smoke_config, 4)] == [
        "b4-static-p0",
        "b4-static-p8",
        "b4-continuous-p0",
    ]
    with pytest.raises(MoecacheError, match="^--batch 3: not one of harness.batch_sizes$"):
        batched_runs.to_decode(smoke_config, 3)
    with pytest.raises(MoecacheError, match="^--run static: not one of harness.batched.runs$"):
        batched_runs.to_decode(smoke_config, 4, "static", BatchShape(4))
    with pytest.raises(MoecacheError, match="^--shape b4-continuous-p8: not one of"):
        batched_runs.to_decode(smoke_config, 4, "lru", BatchShape(4, "continuous", 8))
    fanned = batched_runs.to_decode(smoke_config, 4, "lru", BatchShape(4))
    assert fanned == [(BatchShape(4), ["all", "lru"])]


def test_the_cut_keeps_the_spread_of_lengths_after_the_prefill():
    sequences = [list(range(n)) for n in (20, 40, 80)]
    cut = batched_runs.cut(sequences, 7, 8)
    rest = [len(ids) - 8 for ids in cut]
    assert rest == [2, 6, 13] and np.mean(rest) == 7  # 12 : 32 : 72 of the rest, mean 7
    assert all(ids == full[: len(ids)] for ids, full in zip(cut, sequences, strict=True))
    with pytest.raises(MoecacheError, match="^prefill 19: sequence 0 has fewer than 2 tokens"):
        batched_runs.cut(sequences, 7, 19)


@pytest.mark.pipeline
def test_the_paper_settings_list_a_batched_decode_job_per_run_size_and_shape(tmp_path):
    config = load_yaml(REPO / "config" / "olmoe.yaml")
    out = snakemake(
        tmp_path, "-n", "all", "--cores", "1", configfile=REPO / "config" / "olmoe.yaml"
    ).stdout
    listed = re.findall(r"^rule decode_batched:\n(?:.*\n)*?\s+wildcards: (.*)$", out, re.M)
    harness = config["harness"]
    expected = {
        f"shard=a, batch={s.size}, batching={s.batching}, prefill={s.prefill}, run={run}"
        for s in batch_shapes(harness["batch_sizes"], harness["batched"])
        for run in harness["batched"]["runs"]
    }
    assert len(listed) == len(expected) == 75
    assert set(listed) == expected


@pytest.fixture(scope="module")
def model_and_trace(tmp_path_factory):
    """A seeded random model of the smoke sizes, a few random sequences of unequal length
    and their batch-one LRU trace (what farthest-future reads ahead)."""
    config = load_yaml(REPO / "config" / "smoke.yaml")
    arch, harness = config["model"]["architecture"], config["harness"]
    model = tiny.model("olmoe", arch, 512, seed=0)
    draw = random.Random(0)
    sequences = [[draw.randrange(512) for _ in range(n)] for n in (30, 22, 26, 18)]
    make = harness_decode.policy_factory(
        run_spec("lru"), harness["capacity"], arch["num_experts"], arch["num_experts_per_tok"]
    )
    layers = harness["restricted_layers"]
    with harness_decode.offloaded(model, layers, harness["capacity"], "cpu", 1) as off:
        arm = off.arm("lru", make, harness["capacity"])
        result = harness_decode.decode(model, sequences, "cpu", [arm], off.own, 2)["lru"]
    path = tmp_path_factory.mktemp("trace") / "lru-x1.parquet"
    trace.write(result["trace"], path, {})
    return model, sequences, path


# The batched decode stage's job (jobs.run_decode_batched), ten times: a pipeline test.
@pytest.mark.pipeline
def test_both_fan_out_modes_write_the_same_counts(tmp_path, smoke_config, model_and_trace):
    model, sequences, trace_path = model_and_trace
    gates_file = tmp_path / "gates.json"
    gates_file.write_text(json.dumps(gates_record()))

    def where(name):
        return {"shard": "a", "gates": gates_file, "trace": trace_path, "out_dir": tmp_path / name}

    loaded = (model, sequences)
    shard_files = jobs.run_decode_batched(
        smoke_config, None, None, where("shard"), 4, loaded=loaded
    )
    assert len(shard_files) == 3 * 3  # 3 shapes x 3 runs
    for path in shard_files:
        shape, name = BatchShape.parse(path.parent.name), path.stem
        [alone] = jobs.run_decode_batched(
            smoke_config, None, None, where("run"), 4, name, shape, loaded=loaded
        )
        a, b = json.loads(path.read_text()), json.loads(alone.read_text())
        assert b["fan_out"] == "run" and b["reference"]["run"] == "all"
        for key in ("fills", "steady_copies", "timed_copies", "nll", "timed_tokens"):
            assert a["totals"][key] == b["totals"][key], (path, key)
        if a["lossless"]:
            assert abs(a["totals"]["delta_nll"]) < 5e-3


def replayed(size, lru, oracle, zoo=None):
    shape = BatchShape(size)
    rules = {"lru": lru, "farthest-future": oracle, **(zoo or {})}
    return [
        {"source": "replay", "shape": shape, "rule": r, "copies_per_token": c, "gap_recovered": 0}
        for r, c in rules.items()
    ]


def test_the_verdict_names_the_smallest_batch_below_a_tenth():
    rows = replayed(1, 10, 6) + replayed(2, 10, 9.5) + replayed(4, 10, 8) + replayed(8, 10, 9.2)
    found = batching.small_saving_batch(rows, "static")
    assert found["batch"] == 2 and not found["stays"]  # back above a tenth at B = 4
    assert found["savings"] == pytest.approx({1: 0.4, 2: 0.05, 4: 0.2, 8: 0.08})
    assert batching.small_saving_batch(replayed(1, 10, 6), "static")["batch"] is None
    tail = replayed(1, 10, 6) + replayed(2, 10, 9.5) + replayed(4, 10, 9.2)
    assert batching.small_saving_batch(tail, "static")["stays"]


def test_the_best_zoo_rule_comes_from_the_zoo_alone():
    rows = replayed(1, 10, 6, {"mean-interval": 7, "lfu": 9, "s3-fifo": 8})
    assert batching.best_zoo(rows, BatchShape(1))["rule"] == "s3-fifo"
