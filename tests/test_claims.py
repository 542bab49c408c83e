"""The reproduction scorecard: each claim's verdict is computed from the results files and
flips when its input crosses the tolerance; replay claims answer at the paper's C = N/2
where the run has it; missing inputs are `not run`; bad input is one line and no output."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, moecache
from run_records import (
    accuracy_record,
    bound_record,
    foresight_record,
    heads_record,
    run_record,
    sequence_row,
    tuned_record,
    tuning_log_record,
)

from moecache.report import claim_causes, claims, paper_claims

LRU = 26908  # the shard-a trace at C = 32: LRU's steady copies


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def replay_file(capacity: int, oracle: int, **copies) -> dict:
    """A replay report: LRU, farthest-future and `copies` (rule -> steady copies)."""
    found = {"lru": LRU, "farthest-future": oracle, **copies}
    rules = {
        rule: {
            "totals": {
                "after_fill": n,
                "steady": n,
                "gap_recovered": (LRU - n) / (LRU - oracle),
            }
        }
        for rule, n in found.items()
    }
    shape = {"experts": 64, "top_k": 8, "streams": 64, "tokens": 13184, "timed_tokens": 13120}
    return {"schema": 1, "capacity": capacity, **shape, "rules": rules}


@pytest.fixture
def workdir(tmp_path) -> Path:
    """Replay at the harness's C = 16 and at the paper's C = 32 on shard a, nothing else."""
    w = tmp_path / "run"
    (w / "results/runs/a").mkdir(parents=True)
    write_json(w / "results/replay/a/replay.json", replay_file(16, 20000))
    write_json(w / "results/replay/a/c32/replay.json", replay_file(32, 12229))
    return w


def answer(workdir: Path, key: str) -> dict:
    return next(row for row in claims.scorecard(workdir) if row["key"] == key)


def set_copies(workdir: Path, rule: str, copies: int, capacity: int = 32) -> None:
    where = "c32/" if capacity == 32 else ""
    path = workdir / f"results/replay/a/{where}replay.json"
    report = json.loads(path.read_text())
    oracle = report["rules"]["farthest-future"]["totals"]["after_fill"]
    extra = {r: t["totals"]["after_fill"] for r, t in report["rules"].items()}
    extra.pop("lru"), extra.pop("farthest-future")
    write_json(path, replay_file(capacity, oracle, **{**extra, rule: copies}))


# Claim, the rule whose copies move it, copies inside the tolerance, copies outside it.
# Gap shares: (26,908 - n) / 14,679; the paper's 26.9% +- 5 points and -17.5% +- 5 points.
CROSSINGS = [
    ("ff_vs_lru", "farthest-future", 12813, 11000),  # 2.10x holds, 2.45x is beyond 10%
    ("decayed_frequency", "decayed-frequency", 23000, 21000),  # 26.6% holds, 40.2% differs
    ("mean_interval", "mean-interval", 29500, 26000),  # -17.7% holds, +6.2% differs
    ("mean_interval_literal", "mean-interval-literal", 29000, 31000),  # -14.3%, -27.9%
    ("router_logit", "router-logit", 39000, 30000),  # +44.9% holds, +11.5% differs
]


@pytest.mark.parametrize("key, rule, inside, outside", CROSSINGS)
def test_a_verdict_flips_when_its_input_crosses_the_tolerance(workdir, key, rule, inside, outside):
    set_copies(workdir, rule, inside, capacity=16)
    set_copies(workdir, rule, inside)
    row = answer(workdir, key)
    assert row["verdict"] == "holds", row
    assert row["setting"] == "C = 32 of 64, shard a"
    # Read at C = 32; the harness's C = 16 beside it, for the record.
    assert row["sources"] == "results/replay/a/c32/replay.json results/replay/a/replay.json"
    assert row["other_capacities"].startswith("C = 16: ")
    set_copies(workdir, rule, outside)
    row = answer(workdir, key)
    assert row["verdict"] == "differs"
    # No decode run here: no config to draw a likely cause from, so none is stated.
    assert "stated, not tested" not in row["why"]


def test_mean_interval_names_the_tested_cause(workdir):
    """Today's reading differs from the paper's sign; the literal reading, replayed on the
    same trace, is named beside it (the experiment, not a guess)."""
    set_copies(workdir, "mean-interval", 22000)
    set_copies(workdir, "mean-interval-literal", 29500)
    row = answer(workdir, "mean_interval")
    assert row["verdict"] == "differs" and "stated" not in row["why"]
    assert "the literal reading, a once-seen expert kept, recovers -17.7%" in row["why"]
    assert answer(workdir, "mean_interval_literal")["verdict"] == "holds"


def test_replay_claims_answer_at_the_paper_ratio_or_say_why(workdir):
    set_copies(workdir, "decayed-frequency", 23000)
    set_copies(workdir, "decayed-frequency", 23000, capacity=16)
    assert answer(workdir, "decayed_frequency")["this_run"] == "26.6%"
    (workdir / "results/replay/a/c32/replay.json").unlink()
    row = answer(workdir, "decayed_frequency")
    assert row["verdict"] == "not comparable" and "replay.capacities" in row["why"]
    assert row["setting"] == "C = 16 of 64, shard a"


def test_missing_inputs_are_not_run_and_name_what_is_missing(workdir):
    rows = claims.scorecard(workdir)
    assert [row["key"] for row in rows] == [c.key for c in paper_claims.CLAIMS]
    missing = {row["key"]: row for row in rows if row["verdict"] == "not run"}
    assert "ff_vs_lru" not in missing and "ff_vs_bflat" in missing
    assert "no bound at C = 32" in missing["ff_vs_bflat"]["why"]
    assert "learned evaluation" in missing["learned_scorers"]["why"]
    assert all(row["sources"] == "" and row["why"] for row in missing.values())


def bound_file(capacity: int, b_flat: int, b_greedy: int, b_star: int) -> dict:
    totals = {
        "b_flat": b_flat,
        "b_star": b_star,
        "b_greedy": b_greedy,
        "gap": (b_greedy - b_flat) / b_flat,
        "greedy_gap": (b_greedy - b_star) / b_star,
    }
    return bound_record(capacity=capacity, totals=totals)


def test_bounds_against_the_fewest_copies(workdir):
    path = workdir / "results/replay/a/c32/bound.json"
    write_json(path, bound_file(32, 12000, 12229, 12229))  # B_flat gap 1.9%, B* 0%
    assert answer(workdir, "ff_vs_bflat")["verdict"] == "holds"
    assert answer(workdir, "ff_vs_bstar")["verdict"] == "holds"
    write_json(path, bound_file(32, 11000, 12229, 11500))  # 11.2% and 6.3%
    assert answer(workdir, "ff_vs_bflat")["verdict"] == "differs"
    assert answer(workdir, "ff_vs_bstar")["verdict"] == "differs"


def test_the_foresight_curve_and_sixteen_tokens(workdir):
    shares = {1: 0.20, 2: 0.36, 4: 0.59, 8: 0.86, 16: 0.99, 32: 1.0}
    points = [{"k": k, "gap_recovered": v} for k, v in shares.items()]
    subset = {"streams": 16, "foresight": points, "causal": {}}
    report = foresight_record(capacity=32, subsets={"heldout": subset, "all": subset})
    path = workdir / "results/replay/a/c32/foresight.json"
    write_json(path, report)
    assert answer(workdir, "foresight_16")["verdict"] == "holds"  # 99% against 96 +- 5
    assert answer(workdir, "foresight_curve")["verdict"] == "holds"  # at most 10 points off
    points[3]["gap_recovered"] = 0.87  # 11 points above the paper's 76% at k = 8
    write_json(path, report)
    assert answer(workdir, "foresight_curve")["verdict"] == "differs"
    assert answer(workdir, "foresight_curve")["this_run"].startswith("20/36/59/87/99/100%")


def run_file(name, policy, tokens_per_second, delta_nll, params=None, **fields) -> dict:
    totals = {"tokens_per_second": tokens_per_second, "delta_nll": delta_nll, "rho": 1.0}
    return run_record(
        run=name,
        policy=policy,
        params=params or {},
        restricts=policy not in ("lru", "all-resident"),
        totals=totals,
        base_nll=1.38,
        settings={
            "model": {"source": "allenai/OLMoE-1B-7B-0125"},
            "harness": {"trace_run": "lru", "restricted_layers": [4, 5, 6, 7, 8, 11, 12, 13]},
        },
        **fields,
    )


def test_restricting_policies_faster_than_lru_must_lose_quality(workdir):
    runs = workdir / "results/runs/a"
    write_json(runs / "lru-x1.json", run_file("lru", "lru", 38.3, 0.0))
    write_json(runs / "static-x1.json", run_file("static", "static", 44.0, 0.11, {"window": 64}))
    write_json(
        runs / "dwell-16-x1.json",
        run_file("dwell-16", "dwell", 42.2, 0.067, {"k": 16, "window": 128}),
    )
    row = answer(workdir, "restrict_cost")
    assert row["verdict"] == "holds" and row["this_run"].startswith("+0.067 (dwell-16")
    write_json(
        runs / "dwell-16-x1.json",
        run_file("dwell-16", "dwell", 42.2, 0.05, {"k": 16, "window": 128}),
    )
    assert answer(workdir, "restrict_cost")["verdict"] == "differs"
    # On a model other than the paper's the size of a loss does not compare.
    tiny = run_file("lru", "lru", 38.3, 0.0)
    tiny["settings"]["model"]["source"] = "embedded"
    write_json(runs / "lru-x1.json", tiny)
    row = answer(workdir, "restrict_cost")
    assert row["verdict"] == "not comparable" and "NLL sizes" in row["why"]


def nll_rows(per_sequence: list[float], tokens: int = 100) -> list[dict]:
    """A blocking run's sequence rows with these NLLs a token (what a loss is paired on)."""
    return [
        sequence_row(sequence=i, tokens=tokens + 1, scored=tokens, nll_sum=nll * tokens, nll=nll)
        for i, nll in enumerate(per_sequence)
    ]


def test_the_dwell_window_compares_blocking_dwell_16_with_dwell_64(workdir):
    """An overlapped Dwell-16 (three sequences, its own timing) sorts first and has the
    larger loss here: the claim must compare the blocking Dwell-16 with Dwell-64. Their
    losses are paired over the sequences both decoded: told apart, the claim holds; the
    same means with sequences that disagree, it is undecided and says how many would do."""
    runs = workdir / "results/runs/a"
    window = {"k": 16, "window": 128}
    base = [5.0, 5.2, 4.9, 5.1, 5.3, 5.0, 4.8, 5.2]
    write_json(runs / "lru-x1.json", run_file("lru", "lru", 38.3, 0.0))
    short = [nll + 0.153 for nll in base]
    write_json(
        runs / "dwell-16-x1.json",
        run_file("dwell-16", "dwell", 42.2, 0.153, window, sequences=nll_rows(short)),
    )
    overlapped = run_file(
        "dwell-16-overlap", "dwell", 43.0, 0.196, window, overlap=True, prefetch="none"
    )
    write_json(runs / "dwell-16-overlap-x1.json", overlapped)
    longer = [nll + 0.161 + 0.002 * (i % 2) for i, nll in enumerate(base)]
    dwell_64 = run_file("dwell-64", "dwell", 41.0, 0.161, {"k": 64, "window": 128})
    write_json(runs / "dwell-64-x1.json", {**dwell_64, "sequences": nll_rows(longer)})
    row = answer(workdir, "dwell_window")
    assert row["this_run"].startswith("dwell-16 +0.153"), row
    assert "dwell-64 +0.161" in row["this_run"]
    assert row["verdict"] == "holds"
    assert "dwell-16-overlap" not in row["sources"]
    # The other claims on runs read blocking runs only, too.
    assert "dwell-16-overlap" not in answer(workdir, "restrict_cost")["sources"]
    # The same mean gap, but half the sequences lose more with the longer window.
    mixed = [nll + 0.161 + (0.2 if i % 2 else -0.2) for i, nll in enumerate(base)]
    write_json(runs / "dwell-64-x1.json", {**dwell_64, "sequences": nll_rows(mixed)})
    row = answer(workdir, "dwell_window")
    assert row["verdict"] == "undecided", row
    assert row["why"].startswith("dwell-16 - dwell-64 NLL -0.008 [")
    assert "on 8 sequences: about" in row["why"] and "would tell them apart" in row["why"]
    assert row["setting"] == "1x; loss paired on shard a"
    # A second shard that decoded both adds its sequences to the pairs (a run on one shard
    # alone adds none).
    other = workdir / "results/runs/b"
    write_json(other / "dwell-16-x1.json", json.loads((runs / "dwell-16-x1.json").read_text()))
    write_json(other / "dwell-64-x1.json", {**dwell_64, "sequences": nll_rows(mixed)})
    write_json(other / "lru-x1.json", run_file("lru", "lru", 38.3, 0.0))
    row = answer(workdir, "dwell_window")
    assert "on 16 sequences: about" in row["why"], row
    assert row["setting"] == "1x; loss paired on shards a, b"
    assert "results/runs/b/dwell-64-x1.json" in row["sources"]


def test_run_files_of_another_schema_or_lacking_a_field_are_one_line(workdir):
    runs = workdir / "results/runs/a"
    write_json(runs / "lru-x1.json", {**run_file("lru", "lru", 38.3, 0.0), "schema": 99})
    result = moecache("claims", "--workdir", str(workdir))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "lru-x1.json" in result.stderr and "schema 99" in result.stderr
    lacking = run_file("lru", "lru", 38.3, 0.0)
    del lacking["sequences_decoded"]
    write_json(runs / "lru-x1.json", lacking)
    result = moecache("claims", "--workdir", str(workdir))
    assert result.returncode == 2 and "without field sequences_decoded" in result.stderr


OLMOE = {  # config/olmoe.yaml's sections a run's results files stamp
    "model": {"source": "allenai/OLMoE-1B-7B-0125"},
    "harness": {"trace_run": "lru", "restricted_layers": [4, 5, 6, 7, 8, 11, 12, 13]},
    "controller": {"steps": 500},
    "router_tuning": {"steps": 200},
    "learned": {"steps": 300},
}


def test_likely_causes_come_from_the_config_never_typed_in():
    olmoe = yaml.safe_load((REPO / "config/olmoe.yaml").read_text())
    for name, settings in (("olmoe", olmoe), ("stamped", OLMOE)):
        said = claim_causes.causes(settings)
        assert not any("tiny model" in cause for cause in said.values()), name
        assert "restrict_cost" not in said and "dwell_window" not in said
        assert said["controller_t50"] == "the heads train for 500 steps here (controller.steps)"
    embedded = {**OLMOE, "model": {"source": "embedded"}}
    assert "a tiny model trained here" in claim_causes.causes(embedded)["dwell_window"]
    assert claim_causes.causes(None) == {}


def test_the_command_writes_the_scorecard_or_one_line(workdir, tmp_path):
    out = tmp_path / "figures"
    out.mkdir()
    result = moecache("claims", "--workdir", str(workdir), "--out-dir", str(out))
    assert result.returncode == 0, result.stderr
    frame = pd.read_csv(out / "claims.csv", keep_default_na=False)
    assert list(frame["key"]) == [c.key for c in paper_claims.CLAIMS]
    assert "| verdict |" in (out / "claims.md").read_text()
    assert json.loads((out / "claims.sources.json").read_text())["inputs"]
    # A results file that lacks a field: one line, exit 2, nothing written.
    for name in ("claims.csv", "claims.md", "claims.sources.json"):
        (out / name).unlink()
    broken = replay_file(32, 12229)
    broken["rules"] = {"lru": {"totals": {}}, "farthest-future": {"totals": {}}}
    write_json(workdir / "results/replay/a/c32/replay.json", broken)
    result = moecache("claims", "--workdir", str(workdir), "--out-dir", str(out))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "claim ff_vs_lru" in result.stderr and not list(out.iterdir())
    result = moecache("claims", "--workdir", str(tmp_path / "nowhere"))
    assert result.returncode == 2 and "no results/ folder" in result.stderr


def test_the_smoke_run_builds_the_scorecard(smoke_run):
    """In `all`: one row per claim, every answered row names results files that exist,
    and the smoke run's own rows are answered where it has their inputs."""
    frame = pd.read_csv(smoke_run / "figures/claims.csv", keep_default_na=False)
    assert list(frame["key"]) == [c.key for c in paper_claims.CLAIMS]
    answered = frame[frame["verdict"] != "not run"]
    assert len(answered) >= len(frame) - 4
    for sources in answered["sources"]:
        assert sources and all((smoke_run / f).exists() for f in sources.split())
    assert set(frame["verdict"]) <= {"holds", "differs", "undecided", "not comparable", "not run"}
    # The smoke config replays a second capacity beside the harness's.
    assert (smoke_run / "results/replay/a/c12/bound.json").exists()
    table = pd.read_csv(smoke_run / "figures/table_eviction.csv")
    assert sorted(set(table["capacity"])) == [8, 12]


# ------------------------------------------------------------------------ power
# Every verdict knows its power (issue 48): each premise built to fall on either side.

RISING = [0.40, 0.44, 0.47, 0.52, 0.55, 0.60, 0.63, 0.67]  # beyond its noise
PUBLISHED_HIT = [0.468, 0.554, 0.453, 0.444]  # the published run's 4 steps: no rise


def tuned_router(workdir: Path, name: str, lru: int, decayed: int, log=None) -> None:
    """A router measured in the harness and, for a tuned one (`log`: its simulated hit
    rate a step, its reward the same), its training log."""
    measured = tuned_record(
        model=name,
        teacher_forced={"lru_steady": lru, "decayed_frequency_steady": decayed},
        training=None if name == "base" else {"steps": len(log or [])},
    )
    write_json(workdir / f"results/router_tuning/measured/{name}.json", measured)
    if log is not None:
        steps = [{"step": i, "sim_hit_rate": v, "reward": v} for i, v in enumerate(log)]
        training = tuning_log_record(variant=name, steps=len(log), log=steps)
        write_json(workdir / f"results/router_tuning/{name}/training.json", training)


def test_a_router_that_learned_decides_one_that_did_not_is_undecided(workdir):
    tuned_router(workdir, "base", 4538, 3950)
    tuned_router(workdir, "hit", 4547, 3960, RISING)
    row = answer(workdir, "router_copies")
    assert row["verdict"] == "holds" and row["why"] == "", row
    assert "results/router_tuning/hit/training.json" in row["sources"].split()
    tuned_router(workdir, "hit", 4800, 4180, RISING)  # +5.8%: beyond the 2%
    assert answer(workdir, "router_copies")["verdict"] == "differs"
    # The published run's log: up, then below where it started.
    tuned_router(workdir, "hit", 4547, 3960, PUBLISHED_HIT)
    row = answer(workdir, "router_copies")
    assert row["verdict"] == "undecided" and row["this_run"] == "+0.2% LRU copies"
    assert row["why"].startswith(
        "the hit router's simulated hit rate did not rise beyond its noise (0.468 -> 0.444 "
        "over 4 steps, slope "
    )
    assert row["why"].endswith("train until it does (router_tuning.steps)")
    # No per-step log: its noise cannot be told.
    (workdir / "results/router_tuning/hit/training.json").unlink()
    row = answer(workdir, "router_copies")
    assert row["verdict"] == "undecided" and "no per-step training log of the hit" in row["why"]


def test_every_tuned_router_must_learn_for_the_decayed_frequency_row(workdir):
    tuned_router(workdir, "base", 4538, 4000)  # 11.9% removed
    tuned_router(workdir, "hit", 4547, 4000, RISING)
    tuned_router(workdir, "tag", 4744, 4150, RISING)
    assert answer(workdir, "lfu_removes")["verdict"] == "holds"
    # The harness variant's reward (minus copies a token) must rise too; a rise too slow
    # for its scatter names the steps that would show it.
    slow = [0.50, 0.49, 0.53, 0.50, 0.54, 0.51]
    tuned_router(workdir, "harness", 4498, 3950, slow)
    row = answer(workdir, "lfu_removes")
    assert row["verdict"] == "undecided", row
    assert row["why"].startswith("the harness router's reward (minus copies a token) did not")
    assert "(router_tuning.steps; at this slope and scatter about " in row["why"]
    assert "the hit router" not in row["why"]


def accuracy_run(workdir: Path, task: str, answers: dict, chance: float = 0.25) -> None:
    """A task's Table 2 files: each row's correctness per question (`answers`: row ->
    list of 0/1, the learned seeds' rows `controller-s<seed>-matched`), its summary with
    each row's accuracy and 95% bootstrap interval as the accuracy stage writes them."""
    from moecache.intervals import bootstrap_ratio

    folder = workdir / f"results/accuracy/{task}"
    folder.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(
        [
            {"row": row, "question": f"q{i}", "correct": bool(c)}
            for row, correct in answers.items()
            for i, c in enumerate(correct)
        ]
    )
    frame.to_parquet(folder / "questions.parquet", index=False)
    rows = [
        {
            "row": row,
            "accuracy": sum(correct) / len(correct),
            "accuracy_ci": bootstrap_ratio(correct, [1] * len(correct), 0),
        }
        for row, correct in answers.items()
    ]
    n = len(answers["free"])
    summary = accuracy_record(task=f"moecache_{task}", questions=n, chance=chance, rows=rows)
    write_json(folder / "summary.json", summary)


def answers(n: int, free: float, oracle: float, recent: float, learned: float) -> dict:
    """Nested correctness (a question a lower row gets right, every higher row gets right
    too): the pairs' differences are as clean as the accuracies allow."""

    def first(share: float) -> list[int]:
        return [int(i < round(share * n)) for i in range(n)]

    return {
        "free": first(free),
        "oracle-set": first(oracle),
        "recent-use": first(recent),
        "controller-s0-matched": first(learned),
        "controller-s1-matched": first(learned),
    }


def test_table_2_orders_only_above_chance_and_with_pairs_told_apart(workdir):
    # The published run: 6 questions, every row 2 of 6 right, 4 choices.
    accuracy_run(workdir, "mmlu", answers(6, 1 / 3, 1 / 3, 1 / 3, 1 / 3))
    row = answer(workdir, "table2_order")
    assert row["verdict"] == "undecided", row
    assert row["why"].startswith("free routing does not answer above chance (0.333 [0.000, ")
    assert "on 6 questions, chance 0.250): about 123 questions would clear chance" in row["why"]
    # Well above chance, on enough questions for every strict pair: the order is decided.
    accuracy_run(workdir, "mmlu", answers(400, 0.80, 0.80, 0.60, 0.40))
    row = answer(workdir, "table2_order")
    assert row["verdict"] == "holds" and row["why"] == "", row
    assert row["sources"].split() == [
        "results/accuracy/mmlu/summary.json",
        "results/accuracy/mmlu/questions.parquet",
    ]
    # Learned told apart above the recent set: against the claim.
    accuracy_run(workdir, "mmlu", answers(400, 0.80, 0.80, 0.40, 0.60))
    row = answer(workdir, "table2_order")
    assert row["verdict"] == "differs" and "learned above recent-use" in row["why"]
    # Above chance, but the last pair's gap too small for its questions: the learned rows
    # miss 40 questions the recent set answers and answer 36 it misses.
    close = answers(400, 0.80, 0.80, 0.60, 0.59)
    learned = [int(i < 200 or 240 <= i < 276) for i in range(400)]
    close["controller-s0-matched"] = close["controller-s1-matched"] = learned
    accuracy_run(workdir, "mmlu", close)
    row = answer(workdir, "table2_order")
    assert row["verdict"] == "undecided", row
    assert row["why"].startswith("recent-use - learned +0.010 [")
    assert "questions would tell apart a gap of 0.010" in row["why"]


def test_table_2_reads_a_task_free_routing_answers_above_chance(workdir):
    accuracy_run(workdir, "mmlu", answers(6, 1 / 3, 1 / 3, 1 / 3, 1 / 3))
    accuracy_run(workdir, "docs", answers(400, 0.80, 0.80, 0.60, 0.40))
    row = answer(workdir, "table2_order")
    assert row["setting"] == "task docs, 400 questions" and row["verdict"] == "holds"


def controller_sweep(workdir: Path) -> None:
    """The sweep at 1x: both seeds' heads at thresholds 0.5 and 0.9 beside the simple runs
    (the controller at 0.5 copies 2.7x Dwell-16's), and a blocking run on shard a."""
    sweep = workdir / "results/controller/sweep"
    cells = {
        "t50-x1": [(f"differentiable-s{s}-t50", 0.08, 2.7) for s in (0, 1)],
        "t90-x1": [(f"differentiable-s{s}-t90", 0.30, 0.2) for s in (0, 1)],
        "reference-x1": [("dwell-16", 0.07, 1.0), ("static", 0.11, 0.4)],
    }
    for folder, runs in cells.items():
        for name, loss, copies in runs:
            totals = {
                "delta_nll": loss,
                "tokens_per_second": 40.0,
                "tokens_per_second_ci": [39.0, 41.0],
                "copies_per_token": copies,
            }
            block = {"tokens_between_refreshes": 10.0, "heads_share": 0.1}
            record = run_record(run=name, totals=totals, controller=block, settings=OLMOE)
            write_json(sweep / folder / f"{name}.json", record)
    write_json(workdir / "results/runs/a/lru-x1.json", run_file("lru", "lru", 38.3, 0.0))


def heads_log(workdir: Path, name: str, objective: list[float]) -> None:
    log = [{"step": i, "objective": v} for i, v in enumerate(objective)]
    record = heads_record(seed=int(name[-1]), steps=len(log), log=log)
    write_json(workdir / f"results/controller/heads/{name}.json", record)


# A plateau: fell from 6.0 and flat (within its noise) over the last half of 40 steps.
PLATEAU = [5.0 + 1.0 * 0.6**i + 0.003 * (-1) ** i for i in range(40)]
FALLING = [6.0 - 0.05 * i + 0.02 * (-1) ** i for i in range(10)]  # 10 steps, still falling


def test_the_controller_claims_wait_for_the_heads_to_reach_a_plateau(workdir):
    controller_sweep(workdir)
    for seed in (0, 1):
        heads_log(workdir, f"differentiable-s{seed}", PLATEAU)
    heads_log(workdir, "differentiable-s0-e0.02", FALLING)  # priced: not in the seed mean
    t50, high = answer(workdir, "controller_t50"), answer(workdir, "controller_high")
    assert t50["verdict"] == "holds" and t50["this_run"].startswith("2.70x dwell-16's"), t50
    assert high["verdict"] == "holds", high
    assert "results/controller/heads/differentiable-s1.json" in t50["sources"].split()
    assert "differentiable-s0-e0.02" not in t50["sources"]
    heads_log(workdir, "differentiable-s1", FALLING)
    for key in ("controller_t50", "controller_high"):
        row = answer(workdir, key)
        assert row["verdict"] == "undecided", row
        assert row["why"].startswith(
            "the differentiable-s1 heads trained 10 steps and their objective was still "
            "moving over the last 5 ("
        )
        assert "train to a plateau (controller.steps; at this scatter about " in row["why"]
    heads_log(workdir, "differentiable-s1", [6.0, 6.1, 5.9, 6.0, 6.1, 5.9, 6.0, 6.0])
    row = answer(workdir, "controller_t50")
    assert row["verdict"] == "undecided" and "did not fall beyond its noise" in row["why"]


def causal_study(workdir: Path, share: float, interval: list[float]) -> None:
    """The causal study's record: next-use at C = 16 on shard a's 16 sequences, reaching
    `share` of the gap with `interval`; decayed frequency well below it."""
    rules = {
        "lru": {"copies": 1000, "share": 0.0, "interval": [0.0, 0.0]},
        "farthest-future": {"copies": 500, "share": 1.0, "interval": [1.0, 1.0]},
        "decayed-frequency": {"copies": 860, "share": 0.28, "interval": [0.25, 0.31]},
        "next-use": {"copies": 700, "share": share, "interval": interval},
    }
    study = {
        "schema": 1,
        "seed": 0,
        "capacities": [16],
        "training_sequences": 40,
        "validation_sequences": 8,
        "validation": {"decayed-frequency": 0.3, "next-use": 0.5},
        "chosen": "next-use",
        "tuning": {},
        "next_use": {},
        "shards": {"a": {"16": {"sequences": list(range(16)), "rules": rules}}},
    }
    write_json(workdir / "results/learned/causal.json", study)


@pytest.mark.parametrize(
    "share, interval, verdict",
    [
        (0.56, [0.52, 0.60], "holds"),  # above half by its whole interval
        (0.501, [0.473, 0.526], "undecided"),  # the published shard a, C = 16
        (0.40, [0.35, 0.45], "differs"),  # below half by its whole interval
    ],
)
def test_the_causal_rule_is_undecided_where_its_interval_straddles_half(
    workdir, share, interval, verdict
):
    causal_study(workdir, share, interval)
    row = answer(workdir, "causal_rule")
    assert row["verdict"] == verdict, row
    if verdict == "undecided":
        assert row["why"] == (
            "the interval straddles half of the gap at a C = 16: 50.1% [47.3, 52.6], about "
            "12,544 sequences (here 16): a shard of that many sequences would decide it "
            "(corpus.heldout.sequences)"
        )
    else:
        assert row["why"] == ""


def test_equation_one_is_decided_only_where_the_measurement_ranks_its_runs():
    """Picking the measured winner agrees when the winner is told apart from the runner-up;
    a wrong pick disagrees when the winner is told apart from it; otherwise the timings
    cannot decide, and the reason says how many sequences would."""
    from moecache.report.claim_checks.replay import winner_call, winner_power, winner_text

    def timed(**spans):
        return {
            (50, run): {
                "run": run,
                "measured_ms": (lo + hi) / 2,
                "measured_ms_lo": lo,
                "measured_ms_hi": hi,
            }
            for run, (lo, hi) in spans.items()
        }

    check = {"predicted_winner": "dwell-16", "measured_winner": "static", "runner_up": "dwell-16"}
    apart = timed(static=(7.8, 8.0), **{"dwell-16": (8.2, 8.4)})
    close = timed(static=(7.8, 8.2), **{"dwell-16": (8.0, 8.4)})
    assert winner_call(check, apart, 50) is False
    assert winner_call(check, close, 50) is None
    right = {**check, "predicted_winner": "static"}
    assert winner_call(right, apart, 50) is True and winner_call(right, close, 50) is None
    said = winner_power(50, check, close, 3)
    assert said == (
        "at 50x the measurement cannot rank static and dwell-16 (95% intervals static "
        "7.80-8.20 and dwell-16 8.00-8.40 ms a token, 3 sequences): about 12 sequences "
        "would at this difference (harness.scaled_sequences)"
    )
    assert winner_text(50, {**check, "told_apart": False}) == (
        "50x: predicted dwell-16, measured static (not told apart from dwell-16)"
    )


def test_the_tally_and_the_readme_summary_count_undecided(tmp_path):
    from moecache.report.readme_blocks import claims_summary

    blank = dict.fromkeys(claims.COLUMNS, "")
    rows = [
        {**blank, "claim": "a", "paper": "1", "this_run": "1", "verdict": "holds"},
        {
            **blank,
            "claim": "b",
            "paper": "12-15%",
            "this_run": "9.7% to 10.7%",
            "verdict": "undecided",
            "why": "the hit router's simulated hit rate did not rise beyond its noise (0.468 "
            "-> 0.444 over 4 steps): train until it does (router_tuning.steps)",
        },
    ]
    tally = "2 claims: holds 1, differs 0, undecided 1, not comparable 0, not run 0."
    assert claims.tally(rows) == tally
    table = claims.markdown_table(rows)
    assert "| undecided: the hit router's simulated hit rate did not rise" in table
    # The README's summary: the tally, and why's first clause beside an undecided verdict.
    pd.DataFrame(rows, columns=claims.COLUMNS).to_csv(tmp_path / "claims.csv", index=False)
    summary = claims_summary(tmp_path / "claims.csv")
    assert summary.endswith(tally)
    assert "- **holds**: a. Paper: 1. This run: 1.\n" in summary
    item = " ".join(summary.split("\n- ")[1].split("\n\n")[0].split())
    assert item == (
        "undecided: b. Paper: 12-15%. This run: 9.7% to 10.7%. Why: the hit router's "
        "simulated hit rate did not rise beyond its noise."
    )
