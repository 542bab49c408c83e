"""The two local multiple-choice tasks: MMLU's dev questions parsed from the copy inside
lm-eval, continuation questions from documents, their lm-eval task files, and one offline
lm-eval run on a tiny OLMoE that shows how per-question log-likelihoods come back."""

from __future__ import annotations

import itertools

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from moecache.accuracy import tasks
from moecache.data import corpus, tokenizer
from moecache.errors import MoecacheError

MMLU_PROMPT = (
    "The following are multiple choice questions (with answers) about abstract algebra.\n\n"
    "Statement 1 | Every element of a group generates a cyclic subgroup of the group. "
    "Statement 2 | The symmetric group S_10 has 10 elements.\n"
    "A. True, True\nB. False, False\nC. True, False\nD. False, True\nAnswer:"
)


@pytest.fixture(scope="module")
def texts():
    return [d["text"] for d in itertools.islice(corpus.python_docs(), 60)]


@pytest.fixture(scope="module")
def held_out():
    """Documentation documents of the held-out shards' size (300-950 characters)."""
    docs = (d for d in corpus.python_docs() if 300 <= len(d["text"]) <= 950)
    return list(itertools.islice(docs, 12))


@pytest.fixture(scope="module")
def mmlu():
    return tasks.mmlu_dev_questions()


def test_mmlu_dev_questions_parse(mmlu):
    assert 270 <= len(mmlu) <= 57 * 5
    assert len({q["subject"] for q in mmlu}) == 57
    assert len({q["id"] for q in mmlu}) == len(mmlu)
    for q in mmlu:
        assert q["question"] and len(q["choices"]) == 4 and all(q["choices"])
        assert q["answer"] in range(4)
    first = mmlu[0]
    assert first["id"] == "abstract_algebra:0" and first["question"].startswith("Statement 1 |")
    assert first["choices"] == ["True, True", "False, False", "True, False", "False, True"]
    assert first["answer"] == 2  # "The answer is (C)."
    # A choice that spans lines parses whole; the question with a fifth choice is left out.
    by_id = {q["id"]: q for q in mmlu}
    step = by_id["high_school_computer_science:4"]
    assert step["answer"] == 1 and step["choices"][1].startswith("Step 3: Increase")
    assert "\n" in step["choices"][1] and "Step 4: Repeat" in step["choices"][1]
    assert "college_chemistry:3" not in by_id
    assert mmlu == tasks.mmlu_dev_questions()


def test_cot_blocks_that_cannot_be_parsed_are_counted_and_skipped():
    header = "The following are multiple choice questions (with answers) about x.\n\n"
    good = (
        "Q: What is $\\frac{1}{2}$?\n(A) 0.5\n(B) 2 (C) 1\n\n2 (D) none\nA: ... The answer is (A)."
    )
    five = "Q: Pick\n(A) a (B) b (C) c (D) d (E) e\nA: ... The answer is (E)."
    unsure = "Q: Pick\n(A) a (B) b (C) c (D) d\nA: The answer is (A). No, the answer is (B)."
    silent = "Q: Pick\n(A) a (B) b (C) c (D) d\nA: Let's think step by step."
    shuffled = "Q: Pick\n(A) a (C) c (B) b (D) d\nA: The answer is (A)."
    blocks = "\n\n".join([good, five, unsure, silent, shuffled])
    questions, skipped = tasks.parse_cot_prompts({"x": header + blocks})
    assert skipped == 4
    assert questions == [
        {
            "id": "x:0",
            "subject": "x",
            "question": "What is $\\frac{1}{2}$?",
            "choices": ["0.5", "2", "1\n\n2", "none"],
            "answer": 0,
        }
    ]


def _norm(text: str) -> str:
    return " ".join(text.split())


# A small vocabulary, so that spans of different documents often coincide.
words = st.sampled_from(["a", "b", "c", "def", "x.y()", "`z`", *map(str, range(10))])
documents = st.lists(st.lists(words, min_size=2, max_size=14).map(" ".join), min_size=3, max_size=8)


def test_docs_questions_properties():
    outcomes = []

    # Derandomized: the share of inputs that make questions is a property of the examples
    # drawn, and a fresh draw put it exactly at the bound (50 of 150) once.
    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(
        documents,
        st.integers(1, 12),
        st.integers(0, 2**16),
        st.integers(1, 4),
        st.integers(1, 3),
        st.integers(2, 4),
        st.sampled_from(tasks.DISTRACTORS),
    )
    def check(texts, n, seed, context_words, continuation_words, choices, distractors):
        docs = [{"id": f"d{i}", "text": text} for i, text in enumerate(texts)]
        args = (docs, n, seed, context_words, continuation_words, choices, distractors)
        try:
            rows = tasks.docs_continuation_questions(*args)
        except MoecacheError as error:
            assert "\n" not in str(error)
            outcomes.append(False)
            return
        outcomes.append(bool(rows))
        assert rows == tasks.docs_continuation_questions(*args)
        assert [row["id"] for row in rows] == [f"docs:{k}" for k in range(n)]
        source = {doc["id"]: _norm(doc["text"]) for doc in docs}
        for row in rows:
            options = [_norm(c) for c in row["choices"]]
            assert len(options) == choices and len(set(options)) == choices
            assert all(len(c.split()) == continuation_words for c in row["choices"])
            assert len(row["context"].split()) == context_words
            # The answer is the passage's true continuation in its own document.
            passage = f" {row['context']} {row['choices'][row['answer']]} "
            assert passage in f" {source[row['doc']]} "
            for i, option in enumerate(options):
                if i != row["answer"] and distractors == "reordered":
                    # The answer's own words in another order, never the answer's.
                    assert sorted(option.split()) == sorted(options[row["answer"]].split())
                elif i != row["answer"]:
                    others = (text for name, text in source.items() if name != row["doc"])
                    assert any(f" {option} " in f" {text} " for text in others)

    check()
    # Not vacuous: most drawn settings do produce questions.
    assert sum(outcomes) > len(outcomes) / 3


def test_docs_questions_reuse_documents_and_follow_the_seed(held_out):
    rows = tasks.docs_continuation_questions(held_out, 30, 0, 20, 5)
    assert len(rows) == 30 and len({row["doc"] for row in rows}) == len(held_out)
    assert len({(row["doc"], row["context"]) for row in rows}) == 30
    assert {row["answer"] for row in rows} == {0, 1, 2, 3}
    assert rows != tasks.docs_continuation_questions(held_out, 30, 1, 20, 5)


def test_too_few_documents_is_one_line_error(held_out):
    with pytest.raises(MoecacheError, match="need 4") as error:
        tasks.docs_continuation_questions(held_out[:3], 5, 0, 20, 5)
    assert "\n" not in str(error.value)
    # Identical documents have too few distinct spans for three distractors.
    same = [{"id": f"d{i}", "text": "one two three"} for i in range(4)]
    with pytest.raises(MoecacheError, match="fewer than 3 distinct spans"):
        tasks.docs_continuation_questions(same, 1, 0, 1, 2)


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory, mmlu, held_out):
    out = tmp_path_factory.mktemp("tasks")
    tasks.write_task(out, "moecache_mmlu", mmlu, "mmlu")
    tasks.write_task(
        out, "moecache_docs", tasks.docs_continuation_questions(held_out, 20, 0, 20, 5), "docs"
    )
    return out


def test_written_tasks_load_through_lm_eval(task_dir, mmlu):
    config = yaml.safe_load((task_dir / "moecache_docs.yaml").read_text())
    data = config["dataset_kwargs"]["data_files"]["test"]
    assert data == str(task_dir / "moecache_docs.jsonl") and data.startswith("/")
    loaded = tasks.task_dict(task_dir, ["moecache_mmlu", "moecache_docs"])
    mmlu_task, docs_task = loaded["moecache_mmlu"], loaded["moecache_docs"]
    assert len(list(mmlu_task.test_docs())) == len(mmlu)
    assert len(list(docs_task.test_docs())) == 20
    # lm-eval's own default MMLU prompt, scored by " A" ... " D".
    mmlu_task.build_all_requests(limit=1)
    assert [i.arguments for i in mmlu_task.instances] == [(MMLU_PROMPT, f" {x}") for x in "ABCD"]
    # The docs prompt is the passage; each choice follows after exactly one space.
    docs_task.build_all_requests(limit=1)
    row = next(iter(docs_task.test_docs()))
    assert [i.arguments for i in docs_task.instances] == [
        (row["context"], f" {choice}") for choice in row["choices"]
    ]
    with pytest.raises(MoecacheError, match="no lm-eval task nope"):
        tasks.task_dict(task_dir, ["nope"])
    with pytest.raises(MoecacheError, match="kind"):
        tasks.write_task(task_dir, "bad", mmlu, "mcq")


def test_lm_eval_end_to_end_on_tiny_olmoe(tmp_path, texts, task_dir, smoke_config):
    import torch
    from lm_eval.evaluator import evaluate
    from lm_eval.models.huggingface import HFLM
    from transformers import OlmoeForCausalLM

    from moecache.model import checkpoint

    tokenizer.train(texts, 400, tmp_path / "tok")
    tok = tokenizer.load(tmp_path / "tok")
    # The embedded model saw the boundary token first in every document; HFLM's
    # add_bos_token only reaches a tokenizer it loads itself, so set it on ours.
    tok.add_bos_token = True
    arch = smoke_config["model"]["architecture"] | {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 512,  # HFLM's max_length; longer prompts lose their left
    }
    torch.manual_seed(0)
    model = OlmoeForCausalLM(checkpoint.embedded_config(arch, tok, 0.01)).eval()
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=1, add_bos_token=True)
    assert lm.max_length == 512
    inputs = []
    model_call = lm._model_call
    lm._model_call = lambda inps, **kw: inputs.append(inps[0].tolist()) or model_call(inps, **kw)

    names = ["moecache_mmlu", "moecache_docs"]
    result = evaluate(lm=lm, task_dict=tasks.task_dict(task_dir, names), limit=4, log_samples=True)

    for name in names:
        samples = sorted(result["samples"][name], key=lambda s: s["doc_id"])
        assert [s["doc_id"] for s in samples] == [0, 1, 2, 3]
        for s in samples:
            # One (log-likelihood, is-greedy) per choice, in choice order.
            lls = [ll for ll, _greedy in s["filtered_resps"]]
            assert len(lls) == len(s["doc"]["choices"]) == 4 == len(s["resps"])
            assert s["target"] == s["doc"]["answer"]
            assert s["acc"] == float(max(range(4), key=lls.__getitem__) == s["target"])
        assert result["results"][name]["acc,none"] == pytest.approx(
            sum(s["acc"] for s in samples) / 4
        )
    assert result["samples"]["moecache_mmlu"][0]["doc"]["id"].startswith("abstract_algebra:")
    # Every input starts with the boundary token; the letters " A".." D" differ only in
    # their last token, so lm-eval scores an MMLU question with one forward pass.
    assert all(ids[0] == tok.bos_token_id for ids in inputs)
    mmlu_start = tok(MMLU_PROMPT)["input_ids"][:12]
    assert sum(ids[:12] == mmlu_start for ids in inputs) == 4
