"""The causal rules' study (learned/causal.py): tuned on a training trace only, measured on
a shard's sequences at every capacity with intervals, written as its record and read by the
report's table part, figure and claim (report/causal.py)."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from test_learned import routed

from moecache.errors import MoecacheError
from moecache.learned import causal, causal_check, causal_cost, stage
from moecache.records.causal import CausalCheck, CausalStudy
from moecache.records.demand import Demand
from moecache.records.io import read_record, write_record
from moecache.report import causal as report

SETTINGS = {
    "seed": 3,
    "learned": {
        "validation_sequences": {"shard": 1, "trace": 2},
        "causal": {
            "capacities": [4, 6],
            "grids": {
                "decayed-frequency": {"decay": [0.5, 0.9]},
                "co-activation": {"context_decay": [0.0, 0.5]},
                "reuse-distance": {"overdue": [1.0]},
            },
            "next_use": {
                "horizons": [2],
                "standardise": [True, False],
                "frequency": [0.3],
                "coactivation": [0.0, 0.5],
                "steps": 20,
                "lr": 0.1,
                "l2": 0.0,
            },
        },
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
    assert found.capacities == [4, 6] and found.training_sequences == 4
    assert found.validation_sequences == 2
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


def test_every_choice_is_made_without_reading_the_shards(study, tmp_path):
    """The grids' points, the next-use variant and weights and the rule picked come from the
    training trace alone: the same study over other shards makes the same choices, and the
    next-use variants tried are every horizon with and without standardised inputs, scored
    on the validation sequences."""
    found, _ = study
    other = causal.study(SETTINGS, routed(0), {"b": routed(7, streams=4)}, tmp_path / "models")
    assert other.chosen == found.chosen and other.validation == found.validation
    assert other.tuning == found.tuning
    assert other.next_use["chosen"]["frequency"] == found.next_use["chosen"]["frequency"]
    tried = {(p["horizon"], p["standardise"]) for p in found.next_use["tried"]}
    assert tried == {(2, True), (2, False)}
    assert found.next_use["model"]["standardise"] == found.next_use["control"]["standardise"]


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
    # The rule spoken of is the one chosen on the validation sequences, not the shards' best.
    assert rule == again.chosen == max(again.validation, key=again.validation.get)
    assert set(again.validation) == set(again.tuning) | {"next-use"}
    matplotlib.use("Agg")
    fig, sources = report.figure(path)
    assert sources == [path] and fig.axes[0].get_xlabel().startswith("pool capacity")


def test_grid_points_cover_every_combination():
    points = causal.grid_points({"a": [1, 2], "b": [0.5]})
    assert points == [{"a": 1, "b": 0.5}, {"a": 2, "b": 0.5}]
    assert np.isclose(causal.share({"s": 10}, {"s": 4}, {"s": 7}, ["s"]), 0.5)


def test_the_scorecard_row_and_the_numbers_read_the_study(study, tmp_path):
    import shutil

    from moecache.report.claim_checks import learned as claim_checks
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
    # Decided where every interval clears half of the gap; undecided where one straddles it.
    below, straddling = report.target_calls(study_record)
    expected = "differs" if below else "undecided" if straddling else "holds"
    assert found.verdict == expected and (expected != "holds" or meets)
    section = causal_section(tmp_path / "results/learned/causal.json")
    assert f"validation sequences: {rule} (" in section and "| next-use-permuted |" in section


# The causal check (learned/causal_check.py, causal_cost.py): closed loop against replay, and
# the cost per decision. The closed-loop runs are made here from each rule's one-stream path
# (Policy.change, the call the harness's pooled block makes: tests/test_policies.simulate);
# tests/test_harness.py decodes the rules in the harness itself.
LOOP = {"closed_loop": {"shards": ["a"], "sequences": 3}, "cost": {"sequences": 2, "rounds": 2}}
CHECK_SETTINGS = {
    **SETTINGS,
    "harness": {"capacity": 4},
    "learned": {"causal": {**SETTINGS["learned"]["causal"], **LOOP}},
}
BANDWIDTH = {"tau_ms": 0.04}


def closed_loop_reports(found, demand: Demand, capacity: int, sequences: int) -> list[dict]:
    """Each causal run's results as the harness writes them (the fields the check reads)."""
    from test_policies import simulate

    from moecache.policies import make

    reports = []
    for label, spec in stage.causal_runs(found).items():
        rows = []
        for s in range(sequences):
            policy = make(
                spec["policy"], capacity, demand.num_experts, demand.top_k, spec["params"]
            )
            stream = demand.requests[s, : demand.lengths[s]].tolist()
            run = simulate(policy, stream, list(demand.probs[s, : demand.lengths[s]]))
            rows.append({"sequence": s, "fills": run.insertions - run.steady, "steady": run.steady})
        reports.append({"run": label, "shard": "a", **spec, "sequences": rows})
    return reports


@pytest.fixture(scope="module")
def checked(study):
    found, _ = study
    shard = routed(1, streams=5)
    reports = closed_loop_reports(found, shard, 4, 3)
    return (
        found,
        shard,
        reports,
        causal_check.check(CHECK_SETTINGS, found, {"a": shard}, reports, BANDWIDTH),
    )


def test_the_causal_runs_are_the_studys_chosen_rules(study):
    found, _ = study
    runs = stage.causal_runs(found)
    assert set(runs) == {f"causal-{r}" for r in (*found.tuning, "next-use")}
    assert runs["causal-co-activation"]["params"] == found.tuning["co-activation"]["chosen"]
    assert runs["causal-next-use"]["params"] == found.next_use["chosen"]
    assert stage.causal_loop(CHECK_SETTINGS, "a", found) == (runs, 3)
    assert stage.causal_loop(CHECK_SETTINGS, "b", None) == ({}, None)
    with pytest.raises(MoecacheError, match="give --causal"):
        stage.causal_loop(CHECK_SETTINGS, "a", None)
    with pytest.raises(MoecacheError, match="does not decode its rules there"):
        stage.causal_loop(CHECK_SETTINGS, "b", found)


def test_closed_loop_copies_equal_the_replay_of_the_same_sequences(checked, tmp_path):
    found, shard, reports, result = checked
    loops = result["closed_loop"]["a"]
    assert set(loops) == {*found.tuning, "next-use"}
    for rule, row in loops.items():
        assert list(row["closed_loop"]) == ["seq0", "seq1", "seq2"], rule
        assert row["equal"] and row["closed_loop"] == row["replay"], rule
        assert row["copies"] == row["replay_copies"] > 0
    # One copy more in one sequence of one run: the check says so.
    tampered = [dict(r) for r in reports]
    tampered[0]["sequences"] = [dict(row) for row in reports[0]["sequences"]]
    tampered[0]["sequences"][1]["steady"] += 1
    again = causal_check.check(CHECK_SETTINGS, found, {"a": shard}, tampered, BANDWIDTH)
    record = CausalCheck(**again)
    assert not record.all_equal()
    assert not again["closed_loop"]["a"][tampered[0]["policy"]]["equal"]
    write_record(tmp_path / "causal-check.json", CausalCheck(**result))
    assert read_record(tmp_path / "causal-check.json", CausalCheck).all_equal()


def test_a_missing_causal_run_or_shard_is_one_clear_error(checked):
    found, shard, reports, _ = checked
    with pytest.raises(MoecacheError, match="no closed-loop run of causal-next-use"):
        causal_check.check(
            CHECK_SETTINGS,
            found,
            {"a": shard},
            [r for r in reports if r["run"] != "causal-next-use"],
            BANDWIDTH,
        )
    with pytest.raises(MoecacheError, match="give the trace of every shard"):
        causal_check.check(CHECK_SETTINGS, found, {"b": shard}, reports, BANDWIDTH)


def test_the_cost_is_timed_against_lru_on_the_first_sequences(checked):
    found, shard, _, result = checked
    assert result["cost_sequences"] == ["seq0", "seq1"] and result["rounds"] == 2
    cost = result["cost"]
    assert cost["decisions"] == int(shard.lengths[:2].sum()) and cost["streams"] == 2
    assert list(cost["rules"]) == ["lru", *found.tuning, "next-use"]
    lru = cost["rules"]["lru"]
    assert lru["extra_ns"] == 0 and lru["extra_interval"] == [0, 0]
    first = causal_check.first_sequences(shard, 2)
    lru_copies = sum(causal.copies(first, "lru", 4).values())
    texts = {r["policy"]: causal.rule_text(r["policy"], r["params"]) for r in runs_of(found)}
    texts["lru"] = "lru"
    for rule, row in cost["rules"].items():
        low, high = row["interval"]
        assert 0 < low <= row["ns_per_decision"] <= high, rule
        text = texts[rule]
        saved = lru_copies - sum(causal.copies(first, text, 4).values())
        assert row["copies_saved_per_decision"] == pytest.approx(saved / cost["decisions"])
        assert row["worth_ns"] == pytest.approx(row["copies_saved_per_decision"] * 0.04e6)
        assert row["net_ns"] == pytest.approx(row["worth_ns"] - row["extra_ns"])


def runs_of(found) -> list[dict]:
    return list(stage.causal_runs(found).values())


def test_a_slow_rule_costs_more_than_it_saves(study, monkeypatch):
    """A rule whose every decision waits 300 us costs that much over LRU's, more than the
    copies it could save are worth; the report says so."""
    import time

    from moecache.policies.reuse_distance import ReuseDistance

    found, _ = study
    change = ReuseDistance.change

    def slow(self, *args):
        until = time.perf_counter_ns() + 300_000
        while time.perf_counter_ns() < until:
            pass
        return change(self, *args)

    monkeypatch.setattr(ReuseDistance, "change", slow)
    shard = routed(1, streams=2, steps=20)
    rules = {
        "reuse-distance": ("reuse-distance", {}),
        "decayed-frequency": ("decayed-frequency", {}),
    }
    copies = {r: 100 for r in ("lru", *rules)}
    cost = causal_cost.cost(shard, rules, copies, 0.04, capacity=4, rounds=2, seed=0)
    slow_row = cost["rules"]["reuse-distance"]
    assert slow_row["extra_interval"][0] > 250_000
    assert report.pays({**slow_row, "worth_ns": 40_000}) == "costs more than it saves"
    assert report.pays({**slow_row, "worth_ns": 10 * slow_row["extra_interval"][1]}) == (
        "saves more than it costs"
    )


def test_the_table_part_and_the_scorecard_show_the_check(study, checked, tmp_path):
    import shutil

    from moecache.report.claim_checks import learned as claim_checks
    from moecache.report.evidence import Results

    _, path = study
    record = CausalCheck(**checked[3])
    frame = report.check_frame(record)
    assert list(frame["rule"]) == list(record.cost["rules"])
    assert frame.set_index("rule").loc["lru", "at_1x"] == "the reference"
    causal_rows = frame[frame["rule"] != "lru"]
    assert causal_rows["closed_loop_equals_replay"].all()
    assert "C = 4" in report.check_caption(record)
    (tmp_path / "results/learned").mkdir(parents=True)
    shutil.copy(path, tmp_path / "results/learned/causal.json")
    write_record(tmp_path / "results/learned/causal-check.json", record)
    found = claim_checks.causal_rule(Results(tmp_path))
    assert "closed-loop copies = replay copies (a " in found.why
    assert "results/learned/causal-check.json" in found.sources
