"""The harness: exactness gates hold and can fail, copy counts repeat, bad parameters stop
with one line, and the smoke pipeline decoded every policy."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from conftest import SMOKE, load_yaml, moecache

from moecache.data import corpus
from moecache.errors import MoecacheError
from moecache.harness import decode, gates
from moecache.harness.pool import ExpertPool
from moecache.model import checkpoint
from moecache.policies import POLICIES, ZOO


@pytest.fixture
def smoke(smoke_run):
    config = load_yaml(SMOKE)
    arch = config["model"]["architecture"]
    model = checkpoint.load(smoke_run / "results/model", "float32", "cpu", arch)
    # The smoke model is barely trained: its logits hardly depend on the hidden state. Scale
    # the experts and the output head up so that which expert computes a token visibly
    # changes the NLL (a wrong expert then moves it by about ten times the gate's tolerance).
    for layer in model.model.layers:
        layer.mlp.experts.gate_up_proj.data *= 20
        layer.mlp.experts.down_proj.data *= 50
    model.lm_head.weight.data *= 20
    sequences = corpus.read_sequences(smoke_run / "results/heldout/a.parquet")
    return config, model, sequences


def test_gates_pass_on_the_real_pool(smoke):
    config, model, sequences = smoke
    report = gates.run(model, sequences, config["harness"], warmup_tokens=2)
    assert report["failures"] == []
    gates.check(report)


def test_a_wrong_slot_map_trips_the_gates(smoke, monkeypatch):
    config, model, sequences = smoke
    apply = ExpertPool.apply

    def shifted(self, plan):  # the pool keeps a true map; the block reads one a slot off
        if getattr(self, "shifted_view", None) is self.slot_of:
            self.slot_of = self.true_map
        apply(self, plan)
        self.true_map = self.slot_of
        self.shifted_view = {e: (s + 1) % self.capacity for e, s in self.true_map.items()}
        self.slot_of = self.shifted_view

    monkeypatch.setattr(ExpertPool, "apply", shifted)
    report = gates.run(model, sequences, config["harness"], warmup_tokens=2)
    failed = " ".join(report["failures"])
    for name in gates.lossless_runs(8, 16):
        assert f"{name} NLL" in failed
    with pytest.raises(MoecacheError, match="exactness gate failed: .*> 5e-03"):
        gates.check(report)


def test_batched_gate_fails_on_a_different_model(smoke):
    config, model, sequences = smoke
    report = gates.run(model, sequences, config["harness"], warmup_tokens=2)
    report["batched_nll"] += 1e-3
    assert any("batched" in f for f in gates.failures(report))


def test_a_nan_nll_fails_the_gates(smoke):
    config, model, sequences = smoke
    report = gates.run(model, sequences, config["harness"], warmup_tokens=2)
    report["runs"]["lru"]["nll"] = float("nan")
    assert any(f.startswith("lru NLL nan") for f in gates.failures(report))


@pytest.mark.parametrize("name", ["lru", "decayed-frequency", "dwell-4"])
def test_closed_loop_copy_counts_repeat(smoke, name):
    config, model, sequences = smoke
    spec, arch = config["harness"]["runs"][name], config["model"]["architecture"]
    counts = []
    for _ in range(2):
        make = decode.policy_factory(spec, 8, arch["num_experts"], arch["num_experts_per_tok"])
        with decode.pooled(model, [1, 2], 8, "cpu", 1, make) as blocks:
            totals = decode.decode(model, sequences, "cpu", blocks, warmup_tokens=2)["totals"]
        counts.append((totals["fills"], totals["steady_copies"]))
    assert counts[0] == counts[1] and counts[0][1] > 0


def test_pooled_blocks_are_removed_afterwards(smoke):
    config, model, sequences = smoke
    make = decode.policy_factory({"policy": "lru"}, 8, 16, 4)
    with decode.pooled(model, [1], 8, "cpu", 1, make) as blocks:
        assert model.model.layers[1].mlp is blocks[1]
    assert type(model.model.layers[1].mlp).__name__ == "OlmoeSparseMoeBlock"


def test_copy_multiplier_repeats_copies(smoke):
    config, model, sequences = smoke
    experts = model.model.layers[1].mlp.experts
    pool = ExpertPool(experts, 8, "cpu", multiplier=3)
    pool.clear_counts()
    from moecache.policies import Plan

    pool.apply(Plan(admit=[5, 7]))
    assert torch.equal(pool.gate_up[pool.slot_of[7]], experts.gate_up_proj[7])
    assert pool.fills == 2 and pool.steady == 0 and pool.copy_seconds > 0


def test_decode_results_from_the_pipeline(smoke_run):
    config = load_yaml(SMOKE)
    runs = config["harness"]["runs"]
    decoded = {json.loads(p.read_text())["policy"] for p in smoke_run.glob("results/runs/*/*")}
    # Every policy runs closed loop, the zoo's best two as in the embedded default (each zoo
    # rule's harness path equals its replay: tests/test_zoo.py).
    assert decoded == set(POLICIES) - set(ZOO) | {"lfu", "s3-fifo"}
    for shard in config["corpus"]["heldout"]["shards"]:
        report = json.loads((smoke_run / f"results/gates/{shard}.json").read_text())
        assert report["failures"] == [] and report["runs"].keys() == {
            "lru",
            "dwell-1-window-1",
            "all-resident",
        }
    lru = json.loads((smoke_run / "results/runs/a/lru-x1.json").read_text())
    lru10 = json.loads((smoke_run / "results/runs/a/lru-x10.json").read_text())
    ff = json.loads((smoke_run / "results/runs/a/farthest-future-x1.json").read_text())
    assert lru["totals"]["delta_nll"] == pytest.approx(0, abs=gates.POOL_TOLERANCE)
    assert lru10["totals"]["steady_copies"] == lru["totals"]["steady_copies"]
    assert ff["totals"]["steady_copies"] <= lru["totals"]["steady_copies"]
    assert len(lru["sequences"]) == config["corpus"]["heldout"]["sequences"]
    assert lru["versions"]["torch"] and lru["settings"]["harness"]["runs"] == runs
    trace = pd.read_parquet(smoke_run / "results/traces/a/lru-x1.parquet")
    assert list(trace.columns) == ["sequence", "layer", "token", "requested", "used", "probs"]
    assert set(trace["layer"]) == set(config["harness"]["restricted_layers"])
    assert trace["probs"].map(len).eq(config["model"]["architecture"]["num_experts"]).all()
    assert (trace["requested"].map(sorted) == trace["used"].map(sorted)).all()  # lossless
    probe = json.loads((smoke_run / "results/probe/a.json").read_text())
    assert len(probe["layers"]) == config["model"]["architecture"]["num_hidden_layers"]
    bandwidth = json.loads((smoke_run / "results/bandwidth/cpu.json").read_text())
    assert bandwidth["tau_ms"] > 0 and bandwidth["large_gib_per_s"] > 0


def run_args(smoke_run, tmp_path, run, *extra):
    settings = {k: load_yaml(SMOKE)[k] for k in ("seed", "hub_offline", "model", "harness")}
    return moecache(
        "decode",
        "--settings",
        json.dumps(settings),
        "--model",
        str(smoke_run / "results/model"),
        "--sequences",
        str(smoke_run / "results/heldout/a.parquet"),
        "--run",
        run,
        "--gates",
        str(smoke_run / "results/gates/a.json"),
        "--out",
        str(tmp_path / "r.json"),
        "--trace-out",
        str(tmp_path / "t.parquet"),
        *extra,
    )


@pytest.mark.parametrize(
    ("run", "extra", "message"),
    [
        ("farthest-future", (), "needs --trace-in"),
        ("farthest-future", ("--trace-in", "missing.parquet"), "no trace of an earlier run"),
        ("nope", (), "run 'nope': not in harness.runs"),
        ("lru", ("--multiplier", "0"), "--multiplier: 0 must be at least 1"),
    ],
)
def test_decode_refuses_bad_input_in_one_line(smoke_run, tmp_path, run, extra, message):
    result = run_args(smoke_run, tmp_path, run, *extra)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_a_trace_of_other_sequences_is_refused(smoke_run, tmp_path):
    result = run_args(
        smoke_run,
        tmp_path,
        "farthest-future",
        "--trace-in",
        str(smoke_run / "results/traces/b/lru-x1.parquet"),
    )
    assert result.returncode == 2
    assert "recorded trace does not match this run" in result.stderr


def test_bad_policy_parameters_in_config(smoke_config):
    from moecache import config as configs

    runs = smoke_config["harness"]["runs"]
    cases = [
        ({"policy": "lru", "capacity": 17}, "capacity 17 <= experts 16"),
        ({"policy": "lru", "capacity": 3}, "top-k 4 <= capacity 3"),
        ({"policy": "belady"}, "unknown policy 'belady'"),
        ({"policy": "dwell", "params": {"k": 4, "dwell": 2}}, "unknown parameter 'dwell'"),
        ({"policy": "dwell", "params": {"k": 0}}, "k 0 and window 0 must be >= 1"),
    ]
    for spec, message in cases:
        runs["bad"] = spec
        with pytest.raises(configs.ConfigError, match="harness.runs.bad: .*" + message):
            configs.validate(smoke_config)
    runs.pop("bad")
    smoke_config["harness"]["trace_run"] = "dwell-4"
    with pytest.raises(configs.ConfigError, match="harness.trace_run: 'dwell-4' restricts routing"):
        configs.validate(smoke_config)
