"""The next-use rule (policies/next_use.py) and its fit (learned/next_use.py).

A random model stands in for a fitted one: the rule's contract does not depend on what it
learned. Replay (all streams at once) must make the one-stream path's decisions (Policy.change,
what the harness runs closed loop), every lossless invariant must hold, and a bad file is one
clear error.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from test_policies import simulate
from test_replay import SETTINGS, demands

from moecache.errors import MoecacheError
from moecache.learned import next_use as fitting
from moecache.policies import make
from moecache.records.demand import Demand, padded
from moecache.replay import engine


def model_file(folder, num_experts: int, seed: int = 0, layers=(0,)) -> str:
    rng = np.random.default_rng(seed)
    n, many = num_experts, len(layers)
    model = {
        "follow": rng.normal(size=(many, n, n)),
        "router": rng.normal(size=(many, n, n)),
        "bias": rng.normal(size=(many, n)),
        "layers": np.array(layers, dtype=np.int64),
    }
    path = folder / f"next-use-{num_experts}-{seed}.safetensors"
    fitting.save(model, path, {"made": "by a test"})
    return str(path)


@SETTINGS
@given(demands(probs=True))
def test_replay_makes_the_harness_paths_decisions(tmp_path_factory, case):
    demand, streams, capacity = case
    weights = model_file(tmp_path_factory.mktemp("next-use"), demand.num_experts)
    for frequency, coactivation in ((0.0, 0.0), (0.5, 0.0), (0.3, 0.5)):
        text = f"next-use:weights={weights},frequency={frequency},coactivation={coactivation}"
        counts = engine.run(demand, engine.make_rule(text, demand, capacity), keep=True)
        for i, stream in enumerate(streams):
            params = {"weights": weights, "frequency": frequency, "coactivation": coactivation}
            policy = make("next-use", capacity, demand.num_experts, demand.top_k, params)
            single = simulate(policy, stream, list(demand.probs[i, : len(stream)].astype(float)))
            for step in single.steps:
                replayed = set(np.flatnonzero(counts.evictions[i, step.t]).tolist())
                assert replayed == set(step.plan.evict), (frequency, coactivation, i, step.t)
                assert set(step.request) <= step.after
                assert len(step.after) <= capacity
            assert counts.insertions[i] == single.insertions
        again = engine.run(demand, engine.make_rule(text, demand, capacity))
        assert (again.insertions == counts.insertions).all()


def test_a_missing_or_foreign_model_is_one_clear_error(tmp_path):
    bogus = tmp_path / "bogus.safetensors"
    bogus.write_bytes(b"not a model")
    wrong = model_file(tmp_path, 5)
    two = model_file(tmp_path, 4, 1, layers=(0, 3))
    for weights, layer, why in (
        (tmp_path / "none.safetensors", None, "not a readable next-use model"),
        (bogus, None, "not a readable next-use model"),
        (wrong, None, "missing or not shaped"),
        (two, None, "name the layer"),
        (two, 1, "no model for layer 1"),
    ):
        policy = make("next-use", 2, 4, 1, {"weights": str(weights), "layer": layer})
        with pytest.raises(MoecacheError, match=why):
            policy.reset()
    policy = make("next-use", 2, 4, 1, {"weights": two, "layer": 3})
    policy.reset()
    assert np.array_equal(policy.model["bias"], fitting_bias(two, 1))
    with pytest.raises(MoecacheError, match="needs weights"):
        make("next-use", 2, 4, 1, {})


def fitting_bias(path: str, at: int) -> np.ndarray:
    from safetensors.numpy import load_file

    return load_file(path)["bias"][at]


def alternating(num_experts: int = 6, length: int = 60) -> Demand:
    """Expert 0 then expert 1 then 2, over and over: the next use follows the last."""
    tokens = [np.array([[t % 3]]) for t in range(length)]
    requests, lengths = padded([np.concatenate(tokens)], 1)
    probs = np.full((1, length, num_experts), 0.1 / (num_experts - 1), dtype=np.float32)
    for t in range(length):
        probs[0, t, t % 3] = 0.9
    return Demand(["s"], ["s"], requests, lengths, num_experts, probs)


def test_the_fit_learns_what_follows_and_the_control_does_not():
    """On a cycle 0 -> 1 -> 2 the model gives the next expert the highest odds after each;
    the shuffled-label control (same rows, labels permuted) learns no such order."""
    demand = alternating()
    model, summary = fitting.fit(demand, 1, 200, 0.1, 0.0, 0)
    assert summary["rows"] == 59 and not summary["permuted"]
    assert model["layers"].tolist() == [0] and model["follow"].shape == (1, 6, 6)
    follow = model["follow"][0] + model["bias"][0]
    assert [int(np.argmax(follow[e, :3])) for e in range(3)] == [1, 2, 0]
    control, summary = fitting.fit(demand, 1, 200, 0.1, 0.0, 0, permute=True)
    assert summary["permuted"]
    scores = control["follow"][0] + control["bias"][0]
    ranked = [int(np.argmax(scores[e, :3])) for e in range(3)]
    assert ranked != [1, 2, 0]


def test_the_saved_weights_read_raw_inputs():
    """The fit standardises its inputs; the saved weights, applied to the raw inputs as the
    rule applies them, reach the loss the fit reports (a scaling or a shift left unfolded
    would not)."""
    rng = np.random.default_rng(0)
    n, length = 8, 120
    tokens = [rng.choice(n, 2, replace=False)[None] for _ in range(length)]
    requests, lengths = padded([np.concatenate(tokens)], 2)
    probs = rng.dirichlet(np.full(n, 0.3), size=(1, length)).astype(np.float32)
    demand = Demand(["s"], ["s"], requests, lengths, n, probs)
    model, summary = fitting.fit(demand, 2, 300, 0.05, 0.0, 0)
    x, y = fitting.examples(demand, 2)
    odds = x[:, :n] @ model["follow"][0] + x[:, n:] @ model["router"][0] + model["bias"][0]
    loss = float(np.mean(np.logaddexp(0.0, odds) - y * odds))
    assert loss < np.log(2) - 0.05
    assert abs(loss - summary["final_loss"]["0"]) < 1e-3
