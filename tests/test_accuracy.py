"""Multiple-choice accuracy through lm-eval: free routing through the pooled block scores
every choice as the unmodified model does, the oracle set is chosen from the question's
own routing, and the smoke pipeline fills Table 2 with per-question outputs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import SMOKE, load_yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from run_records import accuracy_record

from moecache.accuracy import evaluate, tasks
from moecache.config import run_spec
from moecache.data import tokenizer as tokenizers
from moecache.model import checkpoint
from moecache.policies import make
from moecache.records.accuracy import AccuracySummary
from moecache.records.io import read_dict


@pytest.fixture(scope="module")
def scored(smoke_run, tmp_path_factory):
    """The smoke model and tokenizer, and both kinds of task on a few questions."""
    config = load_yaml(SMOKE)
    arch = config["model"]["architecture"]
    model = checkpoint.load(smoke_run / "results/model", "float32", "cpu", arch)
    tok = tokenizers.load(smoke_run / "results/tokenizer")
    docs = pd.read_parquet(smoke_run / "results/corpus/shard-a.parquet").to_dict("records")
    out = tmp_path_factory.mktemp("accuracy-tasks")
    tasks.write_task(out, "t_mmlu", tasks.mmlu_dev_questions()[:3], "mmlu")
    questions = tasks.docs_continuation_questions(docs, 3, 0, 8, 4, distractors="reordered")
    tasks.write_task(out, "t_docs", questions, "docs")
    return config, model, tok, tasks.task_dict(out, ["t_mmlu", "t_docs"])


def test_free_routing_through_the_pool_gives_the_unmodified_models_loglikelihoods(scored):
    from lm_eval.evaluator import evaluate as lm_evaluate

    config, model, tok, task_dict = scored
    arch, harness = config["model"]["architecture"], config["harness"]
    lm = evaluate.scorer(model, tok, 128)
    plain = lm_evaluate(lm=lm, task_dict=task_dict, log_samples=True, bootstrap_iters=0)
    free = [evaluate.Row("free", run_spec("all"), arch["num_experts"])]
    pooled = evaluate.evaluate_rows(model, tok, task_dict, free, harness, arch, 128)
    for task in task_dict:
        samples = sorted(plain["samples"][task], key=lambda s: s["doc_id"])
        own = [[float(r[0]) for r in s["filtered_resps"]] for s in samples]
        rows = pooled[pooled["task"] == task]
        assert len(rows) == len(samples) == 3
        np.testing.assert_allclose(
            np.concatenate(rows["loglikelihoods"].tolist()), np.concatenate(own), atol=1e-4
        )
        # Every expert resident: the pool only fills, nothing restricts routing.
        assert (rows["switches"] == 0).all() and (rows["copies"] > 0).all()


def test_the_oracle_set_is_chosen_from_the_questions_own_routing(scored, monkeypatch):
    """The oracle row's blocks start each question with the demand free routing recorded
    on the same tokens, and its refreshes make resident what that demand requests most."""
    from moecache.policies.oracle_set import OracleSet

    config, model, tok, task_dict = scored
    arch, harness = config["model"]["architecture"], config["harness"]
    k, capacity = 4, harness["capacity"]
    seen, real_reset = [], OracleSet.reset

    def spy(self, future=None):
        seen.append((self.layer, [list(r) for r in future]))
        return real_reset(self, future)

    monkeypatch.setattr(OracleSet, "reset", spy)
    recorded = {}
    real_after = evaluate.Counter.after

    def after(self, module, args, kwargs, output):
        real_after(self, module, args, kwargs, output)
        if self.records:
            key = self.key(args, kwargs)
            recorded[key] = {layer: b.requested() for layer, b in self.blocks.items()}

    monkeypatch.setattr(evaluate.Counter, "after", after)
    rows = [
        evaluate.Row("free", run_spec("all"), arch["num_experts"]),
        evaluate.Row("oracle-set", run_spec("oracle-set", {"k": k, "window": 2}), capacity, True),
    ]
    evaluate.evaluate_rows(model, tok, task_dict, rows, harness, arch, 128)
    demands = [d for forward in recorded.values() for d in forward.items()]
    assert seen and all((layer, future) in demands for layer, future in seen)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(0, 7), min_size=2, max_size=2, unique=True), min_size=1, max_size=40
    ),
    st.integers(1, 6),
)
def test_an_oracle_refresh_takes_the_most_requested_experts_of_the_next_k_tokens(stream, k):
    policy = make("oracle-set", 3, 8, 2, {"k": k, "window": 2})
    policy.reset(stream)
    resident: set[int] = set()
    for t, request in enumerate(stream):
        plan = policy.change(t, request, None, resident)
        resident = (resident - set(plan.evict)) | set(plan.admit)
        if plan.refresh:
            counts = np.bincount(np.ravel(stream[t : t + k]), minlength=8)
            target = set(policy.target(t))
            assert target <= resident and len(target) == min(3, np.count_nonzero(counts))
            # No expert left out is requested more often than one taken.
            assert max(counts[[e for e in range(8) if e not in target]], default=0) <= min(
                counts[list(target)]
            )
        assert len(resident) <= 3


def test_the_smoke_pipeline_fills_table2_with_per_question_outputs(smoke_run):
    config = load_yaml(SMOKE)
    table = pd.read_csv(smoke_run / "figures/table2.csv")
    assert set(table["task"]) == set(config["accuracy"]["tasks"])
    for task, spec in config["accuracy"]["tasks"].items():
        summary = read_dict(smoke_run / f"results/accuracy/{task}/summary.json", AccuracySummary)
        questions = pd.read_parquet(smoke_run / f"results/accuracy/{task}/questions.parquet")
        rows = [row["row"] for row in summary["rows"]]
        assert rows[:3] == ["free", "oracle-set", "recent-use"]
        assert {"controller-s0-matched", "controller-s0-t50"} <= set(rows)
        assert set(questions["row"]) == set(rows)
        assert (questions.groupby("row").size() == spec["questions"]).all()
        assert {"question", "loglikelihoods", "prediction", "switches", "copies"} <= set(
            questions.columns
        )
        free = next(r for r in summary["rows"] if r["row"] == "free")
        assert free["retention"] == 1 and free["switch_rate"] == 0


def test_the_paper_settings_sample_the_hubs_mmlu_test_set(monkeypatch, tmp_path):
    """config/olmoe.yaml's mmlu-hub task: a seeded sample of the hub's MMLU test questions
    (no network here: datasets' loader is given a local stand-in), written as lm-eval reads
    it, with the same prompt as the dev questions."""
    import datasets

    from moecache.accuracy import stage

    test = datasets.Dataset.from_dict(
        {
            "question": [f"question {i}?" for i in range(50)],
            "subject": ["anatomy"] * 50,
            "choices": [["w", "x", "y", "z"]] * 50,
            "answer": [i % 4 for i in range(50)],
        }
    )
    asked = []

    def load_dataset(path, name, split):
        asked.append((path, name, split))
        return test

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    spec = {"kind": "mmlu-hub", "dataset": "cais/mmlu", "questions": 12}
    settings = {"seed": 3, "accuracy": {"tasks": {"mmlu": spec}}}
    written = stage.build_task(settings, "mmlu", [], tmp_path)
    rows = [json.loads(line) for line in written.with_suffix(".jsonl").open()]
    assert asked == [("cais/mmlu", "all", "test")]
    assert len(rows) == 12 and len({r["id"] for r in rows}) == 12
    assert all(test[int(r["id"].split(":")[1])]["answer"] == r["answer"] for r in rows)
    again = stage.build_task(settings, "mmlu", [], tmp_path / "again")
    assert again.with_suffix(".jsonl").read_text() == written.with_suffix(".jsonl").read_text()
    monkeypatch.undo()  # lm-eval reads the written jsonl through datasets' own loader
    task = tasks.task_dict(tmp_path, ["moecache_mmlu"])["moecache_mmlu"]
    assert len(list(task.test_docs())) == 12


def test_retention_is_left_undefined_where_free_routing_answers_nothing(tmp_path):
    """A random checkpoint (the rehearsal's) may miss every question: the rows are still
    written, with no retention, and Table 2 prints them."""
    from moecache.accuracy import stage
    from moecache.atomic import write_json
    from moecache.report import tables

    rows = [
        evaluate.Row("free", run_spec("all"), 8),
        evaluate.Row("recent-use", run_spec("dwell"), 4),
    ]
    frame = pd.DataFrame(
        [
            {
                "row": r.name,
                "question": q,
                "correct": False,
                "switch_rate": 0.1,
                "tokens": 10,
                "copies": 3,
            }
            for r in rows
            for q in ("a", "b")
        ]
    )
    summary = stage.summary(frame, rows, 0)
    assert [s["retention"] for s in summary] == [None, None]
    assert summary[1]["accuracy"] == 0 and summary[1]["switch_rate"] == pytest.approx(0.1)
    report = accuracy_record(questions=2, rows=summary)
    write_json(tmp_path / "summary.json", report)
    table = tables.table2([tmp_path / "summary.json"]).parts[""]
    assert list(table["row"]) == ["Free routing", "Fixed set, chosen from recent use"]
    assert table["retention"].isna().all()
