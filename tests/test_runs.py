"""Run, heads and sweep-point names: each built and parsed by moecache.runs alone."""

from __future__ import annotations

import pytest

from moecache.runs import (
    AccuracyRowName,
    HeadsName,
    NameFormatError,
    RunName,
    SweepRunName,
    at_multiplier,
    point_name,
    threshold_of,
)


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


def test_a_scaled_runs_twin_is_its_run_at_1x_under_another_name():
    assert str(RunName("lru", 10).twin) == "lru-twin-x1"
    assert RunName.parse("lru-twin-x1") == RunName("lru", 10).twin


def test_files_and_folders_are_named_by_their_run(tmp_path):
    for name in ("lru-x1.json", "lru-x10.json", "dwell-16-x1.json", "lru-x1.parquet", "t50-x1"):
        (tmp_path / name).touch()
    found = sorted(p.name for p in tmp_path.glob(at_multiplier(1)))
    assert found == ["dwell-16-x1.json", "lru-x1.json"]
    assert [p.name for p in tmp_path.glob(at_multiplier(1, ""))] == ["t50-x1"]
    assert RunName.of(tmp_path / "lru-x10.json") == RunName("lru", 10)
    assert RunName.of("results/controller/sweep/t50-x1") == RunName("t50")


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


@pytest.mark.parametrize(
    ("name", "row"),
    [
        ("controller-s0-matched", AccuracyRowName(0, "matched")),
        ("controller-s12-t50", AccuracyRowName(12, "t50")),
    ],
)
def test_controller_accuracy_row_round_trips(name, row):
    assert AccuracyRowName.parse(name) == row
    assert str(row) == name


@pytest.mark.parametrize("name", ["controller-t50", "controller-s0", "controller-s0-best", "free"])
def test_another_accuracy_row_is_not_the_controllers(name):
    with pytest.raises(NameFormatError, match="not a controller accuracy row name"):
        AccuracyRowName.parse(name)


@pytest.mark.parametrize(
    "name, objective, price, point",
    [
        ("differentiable-s0-t50", "differentiable", None, "t50"),
        ("differentiable-s0-e0.005-t40", "differentiable", 0.005, "t40"),
        ("reinforce-s2-t90", "reinforce", None, "t90"),
    ],
)
def test_a_controller_sweep_run_names_its_heads_and_threshold(name, objective, price, point):
    run = SweepRunName.parse(name)
    assert (run.heads.objective, run.heads.price, run.point) == (objective, price, point)
    assert run.threshold == int(point[1:]) / 100
    assert str(run) == name


@pytest.mark.parametrize("name", ["dwell-16", "static", "lru"])
def test_a_simple_run_of_the_sweep_is_not_a_controller_run(name):
    assert SweepRunName.parse(name) is None
