"""Bad input to a stage: one line naming the problem, exit status 2, no output left behind."""

from __future__ import annotations

import json
import os

import pytest
from conftest import SMOKE, load_yaml, moecache

from moecache.atomic import atomic_file


def settings(*sections):
    config = load_yaml(SMOKE)
    return json.dumps({k: config[k] for k in ("seed", "hub_offline", *sections)})


def assert_one_line_error(result, text):
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("moecache: error: ") and text in lines[0]


def test_missing_corpus_file(tmp_path):
    out = tmp_path / "tok"
    result = moecache(
        "tokenizer",
        "--settings",
        settings("tokenizer"),
        "--train",
        str(tmp_path / "nope.parquet"),
        "--out",
        str(out),
    )
    assert_one_line_error(result, "nope.parquet: no such corpus file")
    assert list(tmp_path.iterdir()) == []


def test_missing_tokenizer(tmp_path):
    result = moecache(
        "heldout",
        "--settings",
        settings("corpus"),
        "--tokenizer",
        str(tmp_path / "none"),
        "--text",
        "x.parquet",
        "--out",
        str(tmp_path / "out.parquet"),
    )
    assert_one_line_error(result, "cannot load")
    assert list(tmp_path.iterdir()) == []


def test_bad_settings_json(tmp_path):
    result = moecache("corpus", "--settings", "{not json", "--out-dir", str(tmp_path / "c"))
    assert_one_line_error(result, "--settings: not valid JSON")


def test_settings_with_wrong_type():
    bad = json.loads(settings("corpus"))
    bad["corpus"]["heldout"]["max_tokens"] = "many"
    result = moecache("corpus", "--settings", json.dumps(bad), "--out-dir", "unused")
    assert_one_line_error(result, "config key corpus.heldout.max_tokens")


def test_atomic_file_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError), atomic_file(target) as tmp:
        tmp.write_text("partial")
        raise RuntimeError("job failed")
    assert list(tmp_path.iterdir()) == []
    with atomic_file(target) as tmp:
        tmp.write_text("whole")
    assert target.read_text() == "whole" and list(tmp_path.iterdir()) == [target]


def test_offline_settings_set_the_hub_libraries_offline(monkeypatch):
    import argparse

    from moecache import command

    names = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    args = argparse.Namespace(config=None, settings=settings("corpus"))
    command.load_settings(args, ("corpus",))
    assert all(os.environ[name] == "1" for name in names)
