"""The learned controller: a higher threshold never refreshes more often, between refreshes
only cached experts compute, the heads' time is inside the measured step, training lowers
its objective, and the smoke pipeline fills Table 1 and the appendix table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import SMOKE, load_yaml, moecache
from fake_clock import FakeClock
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from moecache import config as configs
from moecache.config import run_spec, stages
from moecache.controller import train
from moecache.data import corpus
from moecache.errors import MoecacheError
from moecache.harness import decode, timing
from moecache.harness import pool as pool_module
from moecache.model import checkpoint
from moecache.policies import controller_heads as heads_file
from moecache.policies import make
from moecache.policies.controller import Controller
from moecache.records.controller import LongerSummary
from moecache.records.io import read_dict

HEADS = "results/controller/heads/differentiable-s0.safetensors"


def bare_controller(threshold: float) -> Controller:
    policy = Controller(4, 16, 2, weights="unused.safetensors", threshold=threshold)
    policy.heads, policy.layer = object(), 0  # rows are handed in: no heads file needed
    return policy


@settings(max_examples=60, deadline=None)
@given(
    betas=st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=40),
    low=st.sampled_from([0.4, 0.5, 0.6, 0.7, 0.8]),
    step=st.sampled_from([0.1, 0.2]),
)
def test_a_higher_threshold_never_refreshes_more_often(betas, low, step):
    rng = np.random.default_rng(len(betas))
    refreshed = {}
    for threshold in (low, min(low + step, 0.9)):
        policy, resident, marks = bare_controller(threshold), set(), []
        policy.reset()
        for t, beta in enumerate(betas):
            policy.see(np.concatenate([[beta], rng.standard_normal(16)]))
            plan = policy.change(t, [0, 1], None, resident)
            resident = (resident - set(plan.evict)) | set(plan.admit)
            marks.append(plan.refresh and t > 0)
        refreshed[threshold] = marks
        rng = np.random.default_rng(len(betas))  # the same scores for the next threshold
    low_marks, high_marks = refreshed.values()
    assert all(a or not b for a, b in zip(low_marks, high_marks, strict=True))


def test_the_cached_set_is_kept_across_sequences():
    policy = bare_controller(0.5)
    policy.reset()
    policy.see(np.concatenate([[0.0], np.arange(16.0)]))
    first = policy.change(0, [0, 1], None, set())
    policy.reset()  # a new sequence: an empty pool, the same set
    policy.see(np.concatenate([[0.0], -np.arange(16.0)]))
    again = policy.change(0, [0, 1], None, set())
    assert sorted(again.admit) == sorted(first.admit) == [12, 13, 14, 15]
    assert not again.refresh


@pytest.fixture
def model_and_sequences(smoke_run):
    config = load_yaml(SMOKE)
    arch = config["model"]["architecture"]
    model = checkpoint.load(smoke_run / "results/model", "float32", "cpu", arch)
    sequences = corpus.read_sequences(smoke_run / "results/heldout/a.parquet")
    return config, model, sequences


def controller_arm(off, config, weights, threshold=0.5):
    arch = config["model"]["architecture"]
    spec = run_spec("controller", {"weights": str(weights), "threshold": threshold})
    capacity = config["harness"]["capacity"]
    factory = decode.policy_factory(
        spec, capacity, arch["num_experts"], arch["num_experts_per_tok"]
    )
    return off.arm("controller", factory, capacity)


def test_between_refreshes_only_cached_experts_compute(model_and_sequences, smoke_run, monkeypatch):
    config, model, sequences = model_and_sequences
    seen = []
    real = Controller.change

    def spy(self, t, request, probs, resident):
        plan = real(self, t, request, probs, resident)
        seen.append((self.layer, t, tuple(self.cached), plan.refresh))
        return plan

    monkeypatch.setattr(Controller, "change", spy)
    layers = config["harness"]["restricted_layers"]
    with decode.offloaded(model, layers, config["harness"]["capacity"], "cpu", 8) as off:
        arm = controller_arm(off, config, smoke_run / HEADS, threshold=0.5)
        decode.use(model, arm, off.own)
        decode.decode_one(model, arm, sequences[0], "cpu")
        steps = {layer: block.steps() for layer, block in arm.blocks.items()}
    cached = {(layer, t): (set(s), refresh) for layer, t, s, refresh in seen}
    refreshes = 0
    for layer, rows in steps.items():
        for row in rows:
            held, refresh = cached[(layer, row["token"])]
            assert set(row["used"]) <= held
            assert row["refreshed"] == refresh
            if row["token"] > 0 and not refresh:
                assert held == cached[(layer, row["token"] - 1)][0]
                assert row["copied"] == 0
            refreshes += refresh
    assert refreshes > len(steps)  # some refreshes after the first token, or the test is idle


def test_the_heads_time_is_inside_the_measured_step(model_and_sequences, smoke_run, monkeypatch):
    """On a clock that moves only while the heads decide (2 ms a call), the timed steps add
    up to the heads' time exactly: were the heads timed beside the step, the steps would
    come out empty."""
    config, model, sequences = model_and_sequences
    layers = config["harness"]["restricted_layers"]
    ids = sequences[0]
    clock = FakeClock().install(monkeypatch, timing, pool_module)
    real = heads_file.Heads.decide

    def slow(self, layer, x):
        clock.advance(0.002)
        return real(self, layer, x)

    monkeypatch.setattr(heads_file.Heads, "decide", slow)
    with decode.offloaded(model, layers, config["harness"]["capacity"], "cpu", 8) as off:
        arm = controller_arm(off, config, smoke_run / HEADS)
        decode.use(model, arm, off.own)
        row = decode.decode_one(model, arm, ids, "cpu")
        steps = [s for b in arm.blocks.values() for s in b.steps() if s["token"]]
    added = 0.002 * (len(ids) - 1) * len(layers)  # the first token is not timed
    assert all(s["decide_seconds"] == pytest.approx(0.002) for s in steps)
    assert sum(s["decide_seconds"] for s in steps) == pytest.approx(added)
    assert row["step_seconds"] == pytest.approx(added)


@pytest.mark.parametrize("kind", ["differentiable", "reinforce"])
def test_training_lowers_its_objective_on_a_fixed_batch(model_and_sequences, kind):
    config, model, sequences = model_and_sequences
    model.requires_grad_(False)
    layers = config["harness"]["restricted_layers"]
    torch.manual_seed(0)
    heads = train.new_heads(model, layers)
    weights = config["controller"]["weights"]
    batch = torch.tensor([ids[:24] for ids in sequences if len(ids) >= 24][:4])
    assert len(batch) >= 2

    def cost(installed):
        torch.manual_seed(1)  # the same draws before and after: common random numbers
        with torch.no_grad():
            return np.mean(
                [
                    train.objective(model, installed, batch, weights, kind)[1]["objective"]
                    for _ in range(8)
                ]
            )

    optimizer = torch.optim.Adam(heads.parameters(), lr=0.05)
    with train.Installed(
        model, heads, layers, config["harness"]["capacity"], train.OBJECTIVES[kind], 0.1
    ) as installed:
        before = cost(installed)
        for _ in range(30):
            loss, _ = train.objective(model, installed, batch, weights, kind)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        after = cost(installed)
    assert after < before


def test_a_run_naming_heads_the_section_does_not_train_is_refused(smoke_config):
    smoke_config["harness"]["runs"]["controller-t50"]["params"]["weights"] = (
        "results/controller/heads/reinforce-s7.safetensors"
    )
    with pytest.raises(configs.ConfigError, match="not a heads file the controller section"):
        configs.validate(smoke_config)


def test_an_unknown_objective_is_one_line(smoke_run, tmp_path):
    done = moecache(
        "controller-train",
        "--config",
        str(SMOKE),
        "--model",
        str(smoke_run / "results/model"),
        "--tokenizer",
        str(smoke_run / "results/tokenizer"),
        "--text",
        str(smoke_run / "results/corpus/train.parquet"),
        "--bandwidth",
        str(smoke_run / "results/bandwidth/cpu.json"),
        "--objective",
        "greedy",
        "--seed",
        "0",
        "--out",
        str(tmp_path / "h.safetensors"),
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "moecache: error: controller: unknown objective 'greedy' (known: differentiable, reinforce)"
    ]
    assert not list(tmp_path.iterdir())


def test_a_missing_heads_file_is_one_line():
    policy = make("controller", 4, 16, 2, {"weights": "nowhere.safetensors"})
    policy.layer = 0
    with pytest.raises(MoecacheError, match="no controller heads file"):
        policy.reset()


def test_smoke_run_trains_evaluates_and_fills_the_tables(smoke_run):
    root = smoke_run / "results" / "controller"
    config = load_yaml(SMOKE)
    names = [p.split("/")[-1] for p in stages.controller_heads(config["controller"])]
    for name in names:
        tensors = load_file(root / "heads" / name)  # safetensors, never a pickle
        assert set(tensors) >= {
            f"beta.{layer}.weight" for layer in config["harness"]["restricted_layers"]
        }
    sweep = pd.read_csv(smoke_run / "figures" / "table_controller.csv")
    learned = sweep[sweep["objective"].notna()]
    assert len(learned) == len(names) * len(config["controller"]["thresholds"])
    assert set(sweep.loc[sweep["objective"].isna(), "run"]) == set(config["controller"]["compare"])
    assert (learned["heads_share_pct"] > 0).all()
    table1 = pd.read_csv(smoke_run / "figures" / "table1_policies.csv")
    assert "controller-t50" in set(table1["run"])
    longer = read_dict(root / "longer" / "summary.json", LongerSummary)
    assert set(longer["whole"]) == set(longer["pieces"]) == {"dwell-4", "static", "controller-t50"}
    # The longer-sequence part of the table carries each run's decodings as measured.
    table = pd.read_csv(smoke_run / "figures" / "table_controller_longer.csv")
    for label, tokens in (("pieces", longer["piece_tokens"]), ("whole", longer["tokens"])):
        part = table[table["decoded_as"] == label].set_index("run")
        assert set(part.index) == set(longer[label]) and (part["sequence_tokens"] == tokens).all()
        for name, row in longer[label].items():
            assert part.loc[name, "delta_nll"] == pytest.approx(row["delta_nll"])
    assert longer["tokens"] > longer["piece_tokens"]
