"""Run, heads and sweep-point names: each built and parsed by moecache.runs alone."""

from __future__ import annotations

import pytest

from moecache.runs import HeadsName, NameFormatError, RunName, point_name, threshold_of


@pytest.mark.parametrize(
    ("label", "run", "multiplier"),
    [("lru-x1", "lru", 1), ("dwell-4-x10", "dwell-4", 10), ("t50-x1", "t50", 1)],
)
def test_run_name_round_trips(label, run, multiplier):
    name = RunName.parse(label)
    assert (name.run, name.multiplier) == (run, multiplier)
    assert str(name) == label


def test_a_run_at_1x_by_default():
    assert str(RunName("controller-t50")) == "controller-t50-x1"


@pytest.mark.parametrize("label", ["lru", "lru-x", "LRU-x1", "lru-x1.json"])
def test_a_label_without_its_multiplier_is_refused(label):
    with pytest.raises(NameFormatError, match="not a run name"):
        RunName.parse(label)


@pytest.mark.parametrize(
    ("name", "heads"),
    [
        ("differentiable-s0", HeadsName("differentiable", 0)),
        ("reinforce-s2-e0.005", HeadsName("reinforce", 2, 0.005)),
        ("differentiable-s0-e0", HeadsName("differentiable", 0, 0.0)),
    ],
)
def test_heads_name_round_trips(name, heads):
    assert HeadsName.parse(name) == heads
    assert str(heads) == name


def test_an_unknown_objective_is_refused():
    with pytest.raises(NameFormatError, match="not a controller heads name"):
        HeadsName.parse("greedy-s0")


def test_sweep_points_name_their_threshold():
    thresholds = [0.4, 0.5, 0.9]
    assert [point_name(t) for t in thresholds] == ["t40", "t50", "t90"]
    assert threshold_of("t50", thresholds) == 0.5
    with pytest.raises(NameFormatError, match="t60: not one of controller.thresholds"):
        threshold_of("t60", thresholds)
