"""The corpus: built from Python's own text, deterministic, shards disjoint from each other
and from training; a hub source read through datasets from a local directory."""

from __future__ import annotations

import json

import pytest

from moecache.data import corpus
from moecache.errors import MoecacheError


@pytest.fixture(scope="module")
def docs():
    return [d for d in corpus.python_docs() if len(d["text"]) >= 600]


def test_python_docs_ship_enough_text(docs):
    assert len(docs) > 300
    assert sum(len(d["text"]) for d in docs) > 500_000
    assert any(d["id"].startswith("topic:") for d in docs)
    assert any(d["id"].startswith("doc:") for d in docs)
    assert len({d["id"] for d in docs}) == len(docs)


def test_split_is_disjoint_and_seeded(docs):
    heldout = {"sequences": 16, "max_tokens": 384, "shards": {"a": 0, "b": 16}}
    parts = corpus.split(docs, heldout, seed=0)
    ids = {name: {d["id"] for d in part} for name, part in parts.items()}
    assert len(ids["shard-a"]) == len(ids["shard-b"]) == 16
    assert not ids["shard-a"] & ids["shard-b"]
    assert not (ids["shard-a"] | ids["shard-b"]) & ids["train"]
    assert len(ids["train"]) == len(docs) - 32
    assert corpus.split(docs, heldout, seed=0) == parts
    assert corpus.split(docs, heldout, seed=1)["shard-a"] != parts["shard-a"]


def test_split_refuses_shards_beyond_the_corpus(docs):
    heldout = {"sequences": 16, "max_tokens": 384, "shards": {"a": len(docs)}}
    with pytest.raises(MoecacheError, match="corpus.heldout.shards"):
        corpus.split(docs, heldout, seed=0)


def test_hub_source_reads_a_local_dataset(tmp_path):
    rows = [{"body": f"document {i} " + "word " * (50 + i)} for i in range(30)]
    rows[3]["body"] = "too short"
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings = {
        "source": "hub",
        "min_chars": 100,
        "hub": {"path": "json", "split": "train", "text_field": "body", "data_files": str(data)},
        "heldout": {"sequences": 4, "max_tokens": 32, "shards": {"a": 0, "b": 10}},
    }
    parts = corpus.build(settings, seed=0)
    assert set(parts) == {"shard-a", "shard-b"}
    assert [d["text"].split()[1] for d in parts["shard-a"]] == ["0", "1", "2", "4"]
    assert [d["text"].split()[1] for d in parts["shard-b"]] == ["11", "12", "13", "14"]
    settings["hub"]["text_field"] = "text"
    with pytest.raises(MoecacheError, match="corpus.hub.text_field"):
        corpus.build(settings, seed=0)
