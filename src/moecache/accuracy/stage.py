"""The accuracy stage's jobs: build one multiple-choice task, and score every row on it.

`build_task` writes an lm-eval task (YAML and a local jsonl) from the config's
`accuracy.tasks.<name>`: MMLU's dev questions shipped inside lm-eval (a seeded sample),
the hub's MMLU test set (a seeded sample; the paper settings), or continuations of the
held-out documentation. `score` runs every Table 2 row on it and writes the per-question
outputs (Parquet) and a summary per row (JSON).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pandas as pd

from moecache import provenance
from moecache.accuracy import evaluate, tasks
from moecache.atomic import atomic_file
from moecache.intervals import bootstrap_ratio
from moecache.records.accuracy import AccuracySummary
from moecache.records.io import read_run_dict
from moecache.runs import SweepRunName


def task_name(name: str) -> str:
    return f"moecache_{name}"


def build_task(settings: dict, name: str, documents: list[Path], out_dir: Path) -> Path:
    spec = settings["accuracy"]["tasks"][name]
    rng = random.Random(settings["seed"])
    if spec["kind"] == "mmlu-dev":
        found = tasks.mmlu_dev_questions()
        rows = rng.sample(found, min(spec["questions"], len(found)))
    elif spec["kind"] == "mmlu-hub":
        rows = hub_mmlu(spec, rng)
    else:
        docs = [row for path in documents for row in pd.read_parquet(path).to_dict("records")]
        rows = tasks.docs_continuation_questions(
            docs,
            spec["questions"],
            settings["seed"],
            spec["context_words"],
            spec["continuation_words"],
            distractors=spec["distractors"],
        )
    kind = "docs" if spec["kind"] == "docs" else "mmlu"
    return tasks.write_task(out_dir, task_name(name), rows, kind)


def hub_mmlu(spec: dict, rng: random.Random) -> list[dict]:
    """A seeded sample of MMLU's test questions from the hub (`spec["dataset"]`, e.g.
    cais/mmlu), in the dev questions' row format."""
    import datasets

    test = datasets.load_dataset(spec["dataset"], "all", split="test")
    picked = sorted(rng.sample(range(len(test)), min(spec["questions"], len(test))))
    return [
        {
            "id": f"{test[i]['subject']}:{i}",
            "subject": test[i]["subject"],
            "question": test[i]["question"],
            "choices": list(test[i]["choices"]),
            "answer": int(test[i]["answer"]),
        }
        for i in picked
    ]


def sweep_rates(folders, objective: str) -> list[dict]:
    """The controller sweep's held-out refreshes per token per seed and threshold (heads
    of `objective`, unpriced, at 1x)."""
    out = []
    for folder in folders:
        for path in sorted(Path(folder).glob("*.json")):
            report = read_run_dict(path)
            found = SweepRunName.parse(report["run"])
            heads = found.heads if found else None
            unpriced = heads and heads.objective == objective and heads.price is None
            if unpriced and report["multiplier"] == 1:
                out.append(
                    {
                        "seed": heads.seed,
                        "threshold": report["params"]["threshold"],
                        "refreshes_per_token": report["controller"]["refreshes_per_token"],
                    }
                )
    return out


def score(settings, model_source, tokenizer_source, task_yaml, sweep, heads, out_dir) -> dict:
    """Every row of Table 2 on one task: `{out_dir}/questions.parquet` and `summary.json`.
    `sweep`: the controller sweep's folders; `heads`: the folder of its heads files."""
    from moecache.data import tokenizer as tokenizers
    from moecache.harness import jobs

    accuracy, harness = settings["accuracy"], settings["harness"]
    arch = settings["model"]["architecture"]
    task_yaml = Path(task_yaml)
    name = task_yaml.stem
    rates = sweep_rates(sweep, accuracy["objective"])
    thresholds = evaluate.matched_thresholds(rates, accuracy["switch_every"])
    rows = evaluate.rows_of(accuracy, harness, arch["num_experts"], thresholds, heads)
    model = jobs.load_model(settings, model_source, harness["device"])
    tokenizer = tokenizers.load(tokenizer_source)
    task = tasks.task_dict(task_yaml.parent, [name])
    frame = evaluate.evaluate_rows(
        model, tokenizer, task, rows, harness, arch, accuracy.get("max_length")
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_file(out_dir / "questions.parquet") as tmp:
        frame.to_parquet(tmp, index=False)
    report = {
        "task": name,
        "questions": int((frame["row"] == "free").sum()),
        "chance": float(np.mean([1 / len(lls) for lls in frame["loglikelihoods"]])),
        "switch_every": accuracy["switch_every"],
        "matched_thresholds": {str(s): t for s, t in thresholds.items()},
        "rows": summary(frame, rows, settings["seed"]),
    }
    summary_path, device = out_dir / "summary.json", harness["device"]
    return provenance.write_results(summary_path, report, settings, device, kind=AccuracySummary)


def summary(frame: pd.DataFrame, rows: list, seed: int) -> list[dict]:
    """Per row: accuracy with its 95% interval over questions, retention against free
    routing (paired over the same questions) with its interval, switch rate, copies."""
    free = frame[frame["row"] == "free"].set_index("question")["correct"].astype(float)
    # Retention is undefined where free routing answered nothing right (a random model).
    kept = bool(free.sum())
    out = []
    for row in rows:
        part = frame[frame["row"] == row.name].set_index("question").loc[free.index]
        correct = part["correct"].astype(float).to_numpy()
        ones = np.ones_like(correct)
        out.append(
            {
                "row": row.name,
                "policy": row.spec["policy"],
                "params": row.spec["params"],
                "accuracy": float(correct.mean()),
                "accuracy_ci": bootstrap_ratio(correct, ones, seed),
                "retention": float(correct.sum() / free.sum()) if kept else None,
                "retention_ci": (
                    bootstrap_ratio(correct, free.to_numpy(), seed) if kept else [None, None]
                ),
                "switch_rate": float(
                    (part["switch_rate"] * part["tokens"]).sum() / part["tokens"].sum()
                ),
                "copies_per_token": float(part["copies"].sum() / part["tokens"].sum()),
            }
        )
    return out
