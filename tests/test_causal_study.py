"""The causal rules' study (learned/causal.py): tuned on a training trace only, measured on
a shard's sequences at every capacity with intervals, written as its record and read by the
report's table part, figure and claim (report/causal.py)."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from test_learned import routed

from moecache.learned import causal
from moecache.records.causal import CausalStudy
from moecache.records.io import read_record, write_record
from moecache.report import causal as report

SETTINGS = {
    "seed": 3,
    "learned": {
        "causal": {
            "capacities": [4, 6],
            "grids": {
                "decayed-frequency": {"decay": [0.5, 0.9]},
                "co-activation": {"context_decay": [0.0, 0.5]},
                "reuse-distance": {"overdue": [1.0]},
            },
            "next_use": {
                "horizons": [2],
                "frequency": [0.3],
                "coactivation": [0.0, 0.5],
                "steps": 20,
                "lr": 0.1,
                "l2": 0.0,
            },
        }
    },
}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    folder = tmp_path_factory.mktemp("causal")
    found = causal.study(SETTINGS, routed(0), {"a": routed(1, streams=5)}, folder / "models")
    path = folder / "causal.json"
    write_record(path, found)
    return found, path


def test_every_rule_is_measured_at_every_capacity_with_an_interval(study):
    found, _ = study
    assert found.capacities == [4, 6] and found.training_sequences == 6
    for c in ("4", "6"):
        result = found.shards["a"][c]
        assert len(result["sequences"]) == 5
        rules = result["rules"]
        assert set(rules) == {
            "lru",
            "farthest-future",
            "decayed-frequency",
            "co-activation",
            "reuse-distance",
            "next-use",
            "next-use-permuted",
        }
        assert rules["lru"]["share"] == 0 and rules["farthest-future"]["share"] == 1
        assert rules["farthest-future"]["copies"] <= rules["lru"]["copies"]
        for row in rules.values():
            low, high = row["interval"]
            assert low <= row["share"] + 1e-9 and row["share"] <= high + 1e-9


def test_tuning_reads_the_training_trace_and_keeps_its_best_point(study):
    found, _ = study
    tried = found.tuning["decayed-frequency"]["grid"]
    assert [p["params"] for p in tried] == [{"decay": 0.5}, {"decay": 0.9}]
    best = max(tried, key=lambda p: p["share"])
    assert found.tuning["decayed-frequency"]["chosen"] == best["params"]
    assert found.next_use["control"]["permuted"] and not found.next_use["model"]["permuted"]


def test_the_record_round_trips_and_the_report_reads_it(study, tmp_path):
    found, path = study
    again = read_record(path, CausalStudy)
    assert again.shards == found.shards
    table = report.frame(again)
    assert set(table["capacity"]) == {4, 6}
    assert "lru" not in set(table["rule"]) and "next-use-permuted" in set(table["rule"])
    rule, texts, meets = report.best_rule(again)
    assert rule in set(table["rule"]) and not rule.endswith("-permuted")
    assert len(texts) == 2 and isinstance(meets, bool)
    worst = {r: table[table["rule"] == r]["gap_heldout"].min() for r in set(table["rule"])}
    assert worst[rule] == max(v for r, v in worst.items() if not r.endswith("-permuted"))
    matplotlib.use("Agg")
    fig, sources = report.figure(path)
    assert sources == [path] and fig.axes[0].get_xlabel().startswith("pool capacity")


def test_grid_points_cover_every_combination():
    points = causal.grid_points({"a": [1, 2], "b": [0.5]})
    assert points == [{"a": 1, "b": 0.5}, {"a": 2, "b": 0.5}]
    assert np.isclose(causal.share({"s": 10}, {"s": 4}, {"s": 7}, ["s"]), 0.5)


def test_the_scorecard_row_and_the_numbers_read_the_study(study, tmp_path):
    import shutil

    from moecache.report import claim_checks
    from moecache.report.evidence import Missing, Results
    from moecache.report.numbers.stages import causal_section

    _, path = study
    with pytest.raises(Missing, match="no causal rules' study"):
        claim_checks.causal_rule(Results(tmp_path))
    (tmp_path / "results/learned").mkdir(parents=True)
    shutil.copy(path, tmp_path / "results/learned/causal.json")
    found = claim_checks.causal_rule(Results(tmp_path))
    rule, texts, meets = report.best_rule(read_record(path, CausalStudy))
    study_record = read_record(path, CausalStudy)
    shown = len(study_record.capacities)  # the first shard at every capacity in the value
    assert shown > 1 and found.value == f"{'; '.join(texts[:shown])} ({rule})"
    assert found.elsewhere == texts[shown:]
    assert found.verdict == ("holds" if meets else "differs")
    section = causal_section(tmp_path / "results/learned/causal.json")
    assert f"Best: {rule}" in section and "| next-use-permuted |" in section
