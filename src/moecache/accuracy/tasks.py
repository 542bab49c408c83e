"""The two local multiple-choice tasks, written as lm-eval task folders.

Both are scored by lm-eval as log-likelihood of each choice after the prompt (output_type
multiple_choice, metric acc), so a model answers without generating text:

- "mmlu": the MMLU dev questions that ship inside the lm-eval package (no download), in
  lm-eval's own default MMLU prompt, scored by the answer letter;
- "docs": held-out documentation passages, scored by which of several word spans is the
  passage's true continuation (the others are spans of other documents, or the answer's
  own words reordered).
"""

from __future__ import annotations

import importlib.resources
import json
import random
import re
from pathlib import Path

import yaml

from moecache.atomic import atomic_file
from moecache.errors import MoecacheError, first_line

MMLU_PROMPTS = "tasks/mmlu/flan_cot_fewshot/_cot_prompts.json"
LETTERS = "ABCD"
KINDS = ("mmlu", "docs")

_BLOCK_START = re.compile(r"(?:^|\n\n)Q:")
_OPTIONS = re.compile(r"\(A\)(.*)\(B\)(.*)\(C\)(.*)\(D\)(.*)", re.S)
_ANSWER = re.compile(r"the answer is \(([A-Z])\)", re.I)

# lm-eval's default MMLU prompt (tasks/mmlu/default/_default_template_yaml and the
# per-subject description), with the subject read from the row instead of one yaml each.
MMLU_DESCRIPTION = (
    "The following are multiple choice questions (with answers) about "
    "{{subject.replace('_', ' ')}}.\n\n"
)
MMLU_TEXT = (
    "{{question.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\nC. {{choices[2]}}\n"
    "D. {{choices[3]}}\nAnswer:"
)


def _parse_block(block: str) -> tuple[str, list[str], int] | None:
    """One "Q: ...\\n(A) .. (D) ..\\nA: ... The answer is (X)." block, or None when it is not
    exactly four lettered choices and one stated answer among them."""
    head, sep, explanation = block.partition("\nA:")
    start = head.rfind("\n(A)")
    if not sep or start < 0:
        return None
    question, options = head[:start].strip(), head[start + 1 :]
    # A fifth choice, or a letter twice or out of order, would make the split a guess.
    lettered = _OPTIONS.fullmatch(options)
    if "(E)" in options or any(options.count(f"({x})") != 1 for x in LETTERS) or not lettered:
        return None
    choices = [choice.strip() for choice in lettered.groups()]
    answers = set(_ANSWER.findall(explanation))
    if not question or not all(choices) or len(answers) != 1 or not answers <= set(LETTERS):
        return None
    return question, choices, LETTERS.index(answers.pop())


def parse_cot_prompts(prompts: dict[str, str]) -> tuple[list[dict], int]:
    """The questions of lm-eval's chain-of-thought MMLU prompts, and how many blocks were
    skipped (five choices, an answer outside A-D, no stated answer)."""
    questions, skipped = [], 0
    for subject in sorted(prompts):
        blocks = _BLOCK_START.split(prompts[subject].strip())[1:]  # [0] is the header
        for i, block in enumerate(blocks):
            parsed = _parse_block(block)
            if parsed is None:
                skipped += 1
                continue
            question, choices, answer = parsed
            questions.append(
                {
                    "id": f"{subject}:{i}",
                    "subject": subject,
                    "question": question,
                    "choices": choices,
                    "answer": answer,
                }
            )
    return questions, skipped


def mmlu_dev_questions() -> list[dict]:
    """MMLU's dev questions (5 per subject, 57 subjects) from the copy that ships inside
    lm-eval, so that the task needs no download; the few that do not parse are left out."""
    path = importlib.resources.files("lm_eval").joinpath(MMLU_PROMPTS)
    try:
        prompts = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise MoecacheError(f"lm-eval's {MMLU_PROMPTS}: unreadable ({first_line(error)})") from None
    return parse_cot_prompts(prompts)[0]


def _span(words: list[str], start: int, length: int) -> str:
    return " ".join(words[start : start + length])


def _shuffled_spans(rng: random.Random, words: list[str], length: int):
    """Every span of `length` words of one document, in a seeded order."""
    room = len(words) - length + 1
    for start in rng.sample(range(room), room):
        yield _span(words, start, length)


def _distractors(rng, words, pool, source, answer, count, length) -> list[str]:
    """`count` spans of `length` words from documents other than `source`, none equal to the
    answer or to each other: a few random draws, then every span in a shuffled order, so
    that an impossible request is detected rather than retried forever."""
    taken, out = {answer}, []
    others = [j for j in pool if j != source]
    for _ in range(count):
        found = None
        for _ in range(32):
            j = rng.choice(others)
            span = _span(words[j], rng.randrange(len(words[j]) - length + 1), length)
            if span not in taken:
                found = span
                break
        for j in [] if found else rng.sample(others, len(others)):
            found = next(
                (s for s in _shuffled_spans(rng, words[j], length) if s not in taken), None
            )
            if found:
                break
        if found is None:
            raise MoecacheError(
                f"docs question: other documents have fewer than {count} distinct spans "
                f"of {length} words besides the answer {answer!r}"
            )
        taken.add(found)
        out.append(found)
    return out


def _reorders(rng, answer: str, count: int) -> list[str]:
    """`count` orders of the answer's words other than its own and each other's (a few
    seeded shuffles, then every order is tried only if those fail)."""
    words, taken, out = answer.split(), {answer}, []
    for _ in range(32 * count):
        span = " ".join(rng.sample(words, len(words)))
        if span not in taken:
            taken.add(span)
            out.append(span)
            if len(out) == count:
                return out
    raise MoecacheError(
        f"docs question: the answer {answer!r} has fewer than {count} other word orders"
    )


DISTRACTORS = ("other-documents", "reordered")


def docs_continuation_questions(
    docs: list[dict],
    n: int,
    seed: int,
    context_words: int,
    continuation_words: int,
    choices: int = 4,
    distractors: str = "other-documents",
) -> list[dict]:
    """`n` questions "which span continues this passage?" from held-out documents.
    `distractors`: spans of other documents, or the answer's own words reordered (the
    embedded model tells word order apart far better than one document from another).

    Text is split on whitespace and rejoined with single spaces, so that context, the
    target delimiter lm-eval adds (" ") and a choice read like the document, and spans
    compare equal exactly when their normalized text does. Questions go round-robin over
    the documents long enough for context and continuation (in a seeded order, skipping
    a document once all its offsets are used), at distinct offsets within a document, so
    `n` may exceed the number of documents.
    """
    _check_docs_request(n, context_words, continuation_words, choices, distractors)
    words = [str(doc["text"]).split() for doc in docs]
    length = context_words + continuation_words
    pool = [i for i, w in enumerate(words) if len(w) >= continuation_words]
    sources = [i for i, w in enumerate(words) if len(w) >= length]
    if n and len(pool) < choices:
        raise MoecacheError(
            f"docs questions: {len(pool)} documents of at least {continuation_words} words, "
            f"need {choices} (the answer's and {choices - 1} for distractors)"
        )
    room = {i: len(words[i]) - length + 1 for i in sources}
    if n > sum(room.values()):
        raise MoecacheError(
            f"docs questions: n={n}, but the documents hold {sum(room.values())} "
            f"passages (offsets) of {length} words"
        )
    rng = random.Random(seed)
    rows = []
    # Every passage's offset is drawn before any distractor: the seeded stream's order.
    for k, (i, start) in enumerate(_passage_starts(rng, sources, room, n)):
        answer = _span(words[i], start + context_words, continuation_words)
        if distractors == "reordered":
            others = _reorders(rng, answer, choices - 1)
        else:
            others = _distractors(rng, words, pool, i, answer, choices - 1, continuation_words)
        options = [answer, *others]
        rng.shuffle(options)
        rows.append(
            {
                "id": f"docs:{k}",
                "doc": docs[i]["id"],
                "context": _span(words[i], start, context_words),
                "choices": options,
                "answer": options.index(answer),
            }
        )
    return rows


def _check_docs_request(n, context_words, continuation_words, choices, distractors) -> None:
    """One line on a request no questions can answer, before any document is read."""
    if distractors not in DISTRACTORS:
        raise MoecacheError(
            f"docs questions: distractors {distractors!r} not one of {', '.join(DISTRACTORS)}"
        )
    if n < 0 or context_words < 1 or continuation_words < 1 or choices < 2:
        raise MoecacheError(
            f"docs questions: need n >= 0, context/continuation words >= 1 and choices >= 2, "
            f"got n={n}, {context_words}, {continuation_words}, choices={choices}"
        )


def _passage_starts(rng, sources: list[int], room: dict, n: int) -> list[tuple[int, int]]:
    """`n` passages as (document, start word): round-robin over `sources` in a seeded
    order, a document skipped once its `room` offsets are used, distinct offsets within
    one document."""
    order = rng.sample(sources, len(sources))
    passages, uses = [], dict.fromkeys(order, 0)  # (document, its how-manieth passage)
    while len(passages) < n:
        for i in order:
            if uses[i] < room[i] and len(passages) < n:
                passages.append((i, uses[i]))
                uses[i] += 1
    offsets = {i: rng.sample(range(room[i]), uses[i]) for i in order}
    return [(i, offsets[i][use]) for i, use in passages]


def task_config(name: str, data: Path, kind: str) -> dict:
    """The lm-eval task config: a local jsonl (datasets' `json` builder), log-likelihood of
    each choice, accuracy. lm-eval puts its target_delimiter " " between prompt and choice."""
    if kind not in KINDS:
        raise MoecacheError(f"task {name}: kind {kind!r} is not one of {', '.join(KINDS)}")
    config = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(Path(data).resolve())}},
        "test_split": "test",
        "output_type": "multiple_choice",
    }
    if kind == "mmlu":
        config |= {
            "description": MMLU_DESCRIPTION,
            "doc_to_text": MMLU_TEXT,
            "doc_to_choice": list(LETTERS),
        }
    else:
        config |= {"doc_to_text": "{{context}}", "doc_to_choice": "choices"}
    return config | {
        "doc_to_target": "answer",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    }


def write_task(out_dir: str | Path, name: str, rows: list[dict], kind: str) -> Path:
    """Write `{name}.jsonl` and the `{name}.yaml` lm-eval reads it by; returns the yaml."""
    out_dir = Path(out_dir)
    data, config_path = out_dir / f"{name}.jsonl", out_dir / f"{name}.yaml"
    config = task_config(name, data, kind)
    if not rows:
        raise MoecacheError(f"task {name}: no questions to write")
    with atomic_file(data) as tmp:
        tmp.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    with atomic_file(config_path) as tmp:
        tmp.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return config_path


def task_dict(task_dir: str | Path, names: list[str]) -> dict:
    """lm-eval's tasks `names` ({name: Task}) from the yaml files in `task_dir`, for
    `lm_eval.evaluator.evaluate(lm=..., task_dict=...)`.

    Only `task_dir` is indexed (not lm-eval's thousands of built-in yaml files: faster, and
    no name can clash with a built-in task). TaskManager.load is lm-eval 0.4.13's
    replacement for the deprecated get_task_dict, which returns the same {name: Task}.
    No offline switch is needed: `datasets` builds a local `json` dataset without asking
    the hub (it caches an Arrow copy under HF_HOME), and setting HF_*_OFFLINE here would
    also cut off a hub model that the config allows.
    """
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(task_dir), include_defaults=False)
    missing = sorted(set(names) - set(manager.all_tasks))
    if missing:
        raise MoecacheError(f"{task_dir}: no lm-eval task {', '.join(missing)}")
    return manager.load(list(names))["tasks"]
