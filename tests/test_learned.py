"""Learned eviction: causal features, real labels and a real control, training that learns,
and one scorer's decisions alike in replay, the harness's one-stream path and the pipeline's
closed loop."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import load_settings, moecache
from hypothesis import given
from test_policies import simulate
from test_replay import SETTINGS, demands

from moecache.errors import MoecacheError
from moecache.learned import fit, labels, stage
from moecache.policies import learned_features as features
from moecache.policies import scorers
from moecache.policies.learned import Learned
from moecache.records.demand import Demand
from moecache.records.io import read_dict
from moecache.records.learned import LearnedEvaluation
from moecache.replay import engine

LEARN = {
    "capacity": 4,
    "hidden": 8,
    "gru_hidden": 4,
    "lr": 0.05,
    "steps": 10,
    "gru_steps": 3,
    "batch_events": 32,
    "batch_streams": 2,
    "check_every": 5,
    "dagger_rounds": 1,
}


def routed(seed: int, streams: int = 6, steps: int = 60, experts: int = 12, k: int = 2) -> Demand:
    """Streams with router probabilities whose top-k is each token's request, and a
    favoured few experts so that reuse (and thus eviction choices) matter."""
    rng = np.random.default_rng(seed)
    weights = rng.dirichlet(np.full(experts, 0.3))
    probs = rng.dirichlet(np.full(experts, 0.2), size=(streams, steps)) * 0.7 + weights * 0.3
    requests = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
    names = [f"layer0/seq{i}" for i in range(streams)]
    lengths = np.full(streams, steps, dtype=np.int64)
    return Demand(
        names,
        [f"seq{i}" for i in range(streams)],
        requests,
        lengths,
        experts,
        probs.astype(np.float32),
    )


def saved(tmp_path, kind: str, feature_set: str, seed: int = 0) -> str:
    torch.manual_seed(seed)
    model = scorers.Scorer(kind, feature_set, hidden=6)
    path = tmp_path / f"{kind}.safetensors"
    scorers.save(model, path, {"test": True})
    return str(path)


# --- features ----------------------------------------------------------------------------


@pytest.mark.parametrize("feature_set", list(features.SETS))
def test_features_use_no_future_token(feature_set):
    """Changing every request and router output after token t0 leaves the features of
    tokens up to t0 unchanged (at t they read the history before t and t's router)."""
    demand = routed(1)
    t0 = 25
    other = routed(2)
    changed = Demand(
        demand.streams,
        demand.sequences,
        np.concatenate([demand.requests[:, : t0 + 1], other.requests[:, t0 + 1 :]], axis=1),
        demand.lengths,
        demand.num_experts,
        np.concatenate([demand.probs[:, : t0 + 1], other.probs[:, t0 + 1 :]], axis=1),
    )
    streams = list(range(len(demand.streams)))
    before = fit.feature_table(demand, streams, feature_set)
    after = fit.feature_table(changed, streams, feature_set)
    assert np.array_equal(before[: t0 + 1], after[: t0 + 1])
    assert not np.array_equal(before[t0 + 2 :], after[t0 + 2 :])  # the future did change


def test_unknown_feature_set_is_one_clear_error():
    with pytest.raises(MoecacheError, match="feature set 'future'"):
        features.names("future")


# --- labels ------------------------------------------------------------------------------


def test_labels_are_the_oracles_evictions_among_residents_never_requested():
    demand = routed(3)
    events = labels.oracle_events(demand, LEARN["capacity"])
    counts = engine.run(demand, engine.make_rule("farthest-future", demand, 4), keep=True)
    assert len(events) == int(counts.evictions.any(axis=2).sum()) > 50
    for row in events.itertuples():
        request = set(demand.requests[row.stream, row.token].tolist())
        assert not request & set(row.candidates)
        assert set(row.victims) <= set(row.candidates)
        assert set(row.victims) == set(np.flatnonzero(counts.evictions[row.stream, row.token]))
        # Farthest future: no candidate is next used later than a victim.
        far = {
            c: (n if n >= 0 else 10**9) for c, n in zip(row.candidates, row.next_use, strict=True)
        }
        assert min(far[v] for v in row.victims) >= max(
            far[c] for c in row.candidates if c not in row.victims
        ) or len(row.victims) == len(row.candidates)


def test_the_control_trains_on_labels_that_really_are_permuted(monkeypatch):
    """learn(permute=True) hands training victims drawn among the same candidates, as many
    as the oracle's, and mostly not the oracle's."""
    demand = routed(4)
    events = labels.oracle_events(demand, LEARN["capacity"])
    tables = [fit.Table.of(demand, rows, "past-use") for rows in ([0, 1, 2, 3], [4, 5])]
    seen = []
    real_train = fit.train

    def spy(kind, feature_set, data, valid, settings, seed):
        seen.append(data)
        return real_train(kind, feature_set, data, valid, settings, seed)

    monkeypatch.setattr(fit, "train", spy)
    oracle = fit.dataset(tables[0], events, LEARN["capacity"])
    fit.learn("mlp", "past-use", demand, events, *tables, {**LEARN, "dagger_rounds": 0}, 0, True)
    (handed,) = seen
    assert torch.equal(handed.candidates, oracle.candidates)
    assert torch.equal(handed.valid, oracle.valid)
    assert torch.equal((handed.target > 0).sum(1), (oracle.target > 0).sum(1))
    assert not torch.any((handed.target > 0) & ~handed.valid)
    differs = ((handed.target > 0) != (oracle.target > 0)).any(1).float().mean()
    assert differs > 0.5


# --- training ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", scorers.KINDS)
def test_training_lowers_the_loss_on_a_fixed_batch(kind):
    demand = routed(5)
    events = labels.oracle_events(demand, LEARN["capacity"])
    data = fit.dataset(fit.Table.of(demand, list(range(6)), "router"), events, 4)
    torch.manual_seed(0)
    model = scorers.Scorer(kind, "router", hidden=8)
    fit.standardise(model, data)
    batch = torch.arange(3) if model.recurrent else torch.arange(64)
    optimiser = torch.optim.Adam(model.parameters(), lr=0.02)
    first = fit.batch_loss(model, data, batch).item()
    for _ in range(40):
        optimiser.zero_grad()
        value = fit.batch_loss(model, data, batch)
        value.backward()
        optimiser.step()
    assert fit.batch_loss(model, data, batch).item() < 0.9 * first


def test_gru_one_token_at_a_time_scores_as_over_the_whole_sequence():
    """The rule steps the GRU token by token; training runs whole sequences."""
    torch.manual_seed(0)
    model = scorers.Scorer("gru", "past-use", hidden=5).double()
    x = torch.randn(7, 3, 4, len(features.PAST_USE), dtype=torch.float64)
    whole, _ = model.sequence(x)
    state, steps = None, []
    for t in range(7):
        scores, state = model.step(x[t], state)
        steps.append(scores)
    assert torch.allclose(torch.stack(steps), whole, atol=1e-12)


# --- the rule ----------------------------------------------------------------------------


@SETTINGS
@given(demands(probs=True))
def test_replay_makes_the_harness_paths_decisions(tmp_path_factory, case):
    """Every scorer kind, as an eviction rule: replay (all streams at once) evicts at every
    token exactly what the pooled block's one-stream path (Policy.change) evicts."""
    demand, streams, capacity = case
    tmp = tmp_path_factory.mktemp("scorers")
    for kind, feature_set in (("linear", "router"), ("mlp", "past-use"), ("gru", "router")):
        weights = saved(tmp, kind, feature_set)
        rule = engine.make_rule(
            f"learned:weights={weights},features={feature_set}", demand, capacity
        )
        counts = engine.run(demand, rule, keep=True)
        for i, stream in enumerate(streams):
            policy = Learned(capacity, demand.num_experts, demand.top_k, weights, feature_set)
            single = simulate(policy, stream, list(demand.probs[i, : len(stream)].astype(float)))
            for step in single.steps:
                replayed = set(np.flatnonzero(counts.evictions[i, step.t]).tolist())
                assert replayed == set(step.plan.evict), (kind, i, step.t)


def test_a_missing_or_foreign_weights_file_is_one_clear_error(tmp_path):
    demand = tmp_path / "demand.jsonl"
    demand.write_text(json.dumps({"stream": "s", "tokens": [[0], [1], [2], [0]]}) + "\n")
    bogus = tmp_path / "bogus.safetensors"
    bogus.write_bytes(b"not a safetensors file")
    for weights, why in (
        (tmp_path / "none.safetensors", "no scorer weights"),
        (bogus, "not a scorer weights file"),
    ):
        result = moecache(
            "replay",
            "--demand",
            str(demand),
            "--experts",
            "3",
            "--capacity",
            "2",
            "--rule",
            f"learned:weights={weights},features=past-use",
        )
        assert result.returncode == 2
        assert why in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_weights_trained_on_other_features_are_refused(tmp_path):
    weights = saved(tmp_path, "mlp", "past-use")
    with pytest.raises(MoecacheError, match="trained on past-use features, not router"):
        scorers.load(weights, "router")


def test_foresight_equivalent_interpolates_the_curve():
    points = [
        {"k": 1, "gap_recovered": 0.4},
        {"k": 2, "gap_recovered": 0.7},
        {"k": 4, "gap_recovered": 0.9},
        {"k": None, "gap_recovered": 1.0},
    ]
    assert stage.foresight_equivalent(0.3, points) is None
    assert stage.foresight_equivalent(0.55, points) == pytest.approx(1.5)
    assert stage.foresight_equivalent(0.8, points) == pytest.approx(3.0)
    assert stage.foresight_equivalent(0.95, points) == 4.0


# --- the pipeline ------------------------------------------------------------------------


def test_pipeline_scorers_agree_in_replay_and_closed_loop(smoke_run):
    """Every closed-loop scorer copied, sequence by sequence, what its replay on the same
    trace copied, with routing (NLL) unchanged; every group trained its scorers and the
    control on permuted labels, selected by validation loss; held-out sequences unfitted."""
    from conftest import SMOKE

    config = load_settings(SMOKE)
    evaluation = read_dict(smoke_run / "results/learned/evaluation.json", LearnedEvaluation)
    loops = [loop for r in evaluation["shards"].values() for loop in r["closed_loop"].values()]
    assert len(loops) == len(config["learned"]["closed_loop"]) + 1  # router/* on both shards
    for loop in loops:
        assert loop["matches_replay"] is True
        assert abs(loop["delta_nll"]) < 1e-5
    training = evaluation["training"]
    assert training["router/mlp-permuted"]["permuted_labels"] is True
    assert len(training["router/mlp-permuted"]["rounds"]) == 1  # no DAgger on random labels
    dagger = config["learned"]["dagger_rounds"]
    assert len(training["router/mlp"]["rounds"]) == dagger + 1
    assert training["router/mlp"]["permuted_labels"] is False
    heldout = config["replay"]["heldout_sequences"]
    shard = config["corpus"]["heldout"]["sequences"]
    for name, about in training.items():
        assert 0 <= about["selected_step"] <= about["steps"], name
        if name.startswith("past-use-"):
            fitted = shard - heldout - config["learned"]["validation_sequences"]["shard"]
            assert about["fit_sequences"] == fitted
    for result in evaluation["shards"].values():
        assert result["replay"]["heldout"]["oracle"]["gap_recovered"] == 1.0
    # The README's block names the best scorer and every scorer's share, row by row.
    from moecache.report import numbers

    block = numbers.learned_section(smoke_run)
    assert "Best learned scorer on the held-out sequences of every shard" in block
    assert all(f"| {name} |" in block for name in training)


def test_training_trace_records_the_routing_the_harness_records(smoke_run):
    """The teacher-forced recorder, run on a held-out shard, gives the LRU run's trace."""
    from conftest import SMOKE

    from moecache.data import corpus
    from moecache.harness import jobs
    from moecache.learned import trace

    config = load_settings(SMOKE)
    layers = config["harness"]["restricted_layers"]
    model = jobs.load_model(config, str(smoke_run / "results/model"), "cpu")
    sequences = corpus.read_sequences(smoke_run / "results/heldout/a.parquet")
    rows = pd.DataFrame(trace.record(model, sequences, layers, "cpu"))
    harness = pd.read_parquet(smoke_run / "results/traces/a/lru-x1.parquet")
    keys = ["sequence", "layer", "token"]
    both = harness.merge(rows, on=keys, suffixes=("", "_recorded"))
    assert len(both) == len(harness) == len(rows)
    same = [
        list(a) == list(b)
        for a, b in zip(both["requested"], both["requested_recorded"], strict=True)
    ]
    assert np.mean(same) >= 0.999
    gap = max(
        np.abs(np.asarray(a) - b).max()
        for a, b in zip(both["probs"], both["probs_recorded"], strict=True)
    )
    assert gap < 1e-5
    recorded = pd.read_parquet(smoke_run / "results/learned/training-trace.parquet")
    assert recorded["sequence"].nunique() == config["corpus"]["trace_sequences"]


def test_learned_without_a_training_trace_is_a_config_error(smoke_config, tmp_path):
    del smoke_config["corpus"]["trace_sequences"]
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps(smoke_config))
    result = moecache("validate-config", str(path))
    assert result.returncode != 0
    assert "corpus.trace_sequences" in result.stderr
