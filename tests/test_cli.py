"""Bad input to a stage: one line naming the problem, exit status 2, no output left behind."""

from __future__ import annotations

import argparse
import inspect
import json
import os
from pathlib import Path

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
    from moecache.cli import command

    names = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    args = argparse.Namespace(config=None, settings=settings("corpus"))
    command.load_settings(args, ("corpus",))
    assert all(os.environ[name] == "1" for name in names)


# A command line each subcommand accepts, with the flags the Snakemake rules pass it.
SET = ("--settings", "{}")
ON_MODEL = (*SET, "--model", "m")
ON_TRACE = ("--trace", "t.parquet", "--capacity", "8")
ACCEPTED = {
    "validate-config": ["config.yaml"],
    "corpus": [*SET, "--out-dir", "c"],
    "tokenizer": [*SET, "--train", "t.parquet", "--out", "tok"],
    "heldout": [*SET, "--tokenizer", "tok", "--text", "h.parquet", "--out", "s.parquet"],
    "plan": ["--configfile", "c.yaml", "--gpu-gib", "80", "--out", "plan.json"],
    "plan-table": ["--configfile", "a.yaml", "b.yaml", "--gpu-gib", "24", "80"],
    "train": [*SET, "--tokenizer", "tok", "--train", "t.parquet", "--out", "model"],
    "profile-model": [*ON_MODEL, "--sequences", "s", "--out", "p.json"],
    "gates": [*ON_MODEL, "--sequences", "s", "--out", "g.json"],
    "decode": [*ON_MODEL, "--sequences", "s", "--shard", "a", "--gates", "g", "--out-dir", "d"],
    "decode-batched": [
        *ON_MODEL,
        *("--sequences", "s", "--shard", "a", "--gates", "g", "--trace", "t.parquet"),
        *("--batch", "4", "--run", "lru", "--shape", "b4-static-p0", "--out-dir", "d"),
    ],
    "probe-layers": [*ON_MODEL, "--sequences", "s", "--gates", "g", "--out", "p.json"],
    "bandwidth": [*ON_MODEL, "--out", "b.json"],
    "link-check": [*ON_MODEL, "--sequences", "s", "--out", "l.json"],
    "tiers-harness": [*ON_MODEL, "--sequences", "s", "--out", "t.json", "--gpu-check", "g"],
    "tiers-check": ["t.json"],
    "gpu-check": ["--out", "g.json", "--device", "cuda:1"],
    "benchmark-replay-scale": ["--sequences", "2", "--capacity", "8", "--json"],
    "benchmark-per-request": ["--rounds", "2", "--json"],
    "trace": ["convert", "rows.jsonl", "--experts", "8", "--out", "t.parquet"],
    "replay": [*ON_TRACE, "--rule", "lru", "--out", "r.json"],
    "bound": [*ON_TRACE, "--mixed-share", "0.5", "--out", "b.json"],
    "optimum": ["--demand", "d.jsonl", "--experts", "8", "--capacity", "4"],
    "foresight": [*ON_TRACE, "--foresight", "0", "4", "--heldout-last", "2", "--out", "f"],
    "tiers-grid": [*SET, "--trace", "a=t.parquet", "b=u.parquet", "--out", "g.json"],
    "optimum-sweep": [*SET, "--out", "o.json"],
    "benchmark-replay": [*SET, "--out", "b.json"],
    "learned-trace": [*ON_MODEL, "--tokenizer", "tok", "--text", "t", "--out", "o"],
    "learned-labels": [*ON_TRACE, "--out", "l.parquet"],
    "learned-fit": [*SET, "--group", "router", "--trace", "t", "--labels", "l", "--out-dir", "o"],
    "learned-closed-loop": [
        *ON_MODEL, "--sequences", "s", "--gates", "g", "--out-dir", "o", "--shard", "a",
        "--causal", "c.json",
    ],
    "learned-evaluate": [*SET, "--trace", "a=t", "--foresight", "a=f", "--scorers", "s"],
    "learned-causal": [
        *SET, "--training", "t.parquet", "--trace", "a=t", "--out-dir", "m", "--out", "c.json"
    ],
    "learned-causal-check": [
        *SET, "--causal", "c.json", "--trace", "a=t", "--closed-loop", "d", "--bandwidth", "b",
        "--out", "k.json",
    ],
    "router-train": [
        *ON_MODEL, "--tokenizer", "tok", "--variant", "hit", "--text", "t", "--out-dir", "d"
    ],
    "router-measure": [
        *ON_MODEL, "--tokenizer", "tok", "--name", "base", "--sequences", "s", "--out", "o"
    ],
    "controller-train": [
        *ON_MODEL, "--tokenizer", "tok", "--text", "t", "--bandwidth", "b", "--out", "o",
        "--objective", "reinforce", "--seed", "1",
    ],
    "controller-sweep": [
        *ON_MODEL, "--sequences", "s", "--gates", "g", "--out-dir", "o", "--shard", "a",
        "--point", "0.5", "--heads", "h.safetensors",
    ],
    "controller-longer": [
        *ON_MODEL, "--sequences", "s", "--gates", "g", "--heads", "h", "--out-dir", "o",
        "--shard", "a",
    ],
    "accuracy-task": [*SET, "--task", "mmlu", "--documents", "d", "--out-dir", "o"],
    "accuracy": [
        *ON_MODEL, "--task", "t", "--out-dir", "o", "--heads-dir", "h", "--tokenizer", "tok"
    ],
    "choose": ["--runs", "a.json", "--tau-ms", "0.5", "--max-loss", "0.1"],
    "table": ["table1", "--runs", "r", "--scaled", "s", "--bandwidth", "b", "--gpu-check"],
    "figure": ["fig2", "--foresight", "f", "--learned", "l", "--out-dir", "o"],
    "numbers": ["--workdir", ".", "--shards", "a", "b", "--runs", "r", "--readme", "R.md"],
    "claims": ["--workdir", ".", "--shards", "a", "--out-dir", "o"],
}  # fmt: skip


def subcommands(parser) -> dict:
    """The subcommands `moecache --help` lists, by name."""
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def test_every_subcommand_parses_its_rules_flags():
    from moecache import cli

    parser = cli.parser()
    assert set(subcommands(parser)) == set(ACCEPTED)
    for name, argv in ACCEPTED.items():
        args = parser.parse_args([name, *argv])
        assert args.command == name and callable(args.func), name


def test_a_table_refuses_an_input_it_does_not_read(tmp_path):
    out = tmp_path / "figures"
    result = moecache("table", "table2", "--bound", "x.json", "--out-dir", str(out))
    assert_one_line_error(result, "table table2 does not read --bound")
    assert not out.exists()
    result = moecache("figure", "fig1", "--gpu-check", "--out-dir", str(out))
    assert_one_line_error(result, "figure fig1 does not read --gpu-check")


def test_an_input_given_with_no_files_reaches_the_builder_as_empty():
    from moecache import cli
    from moecache.cli import report as commands

    def builder(runs, replication):
        return runs, replication

    args = cli.parser().parse_args(["table", "t", "--runs", "a.json", "--replication"])
    builders = {"t": (builder, ("runs", "replication"))}
    assert commands.built(builders, args, "table") == ([Path("a.json")], [])
    args = cli.parser().parse_args(["table", "t", "--runs", "a.json"])
    assert commands.built(builders, args, "table") == ([Path("a.json")], [])


def test_each_builder_declares_its_parameters_as_its_inputs():
    from moecache.cli import report as commands
    from moecache.report import figures, tables

    roles = {role for role, _ in commands.INPUTS}
    for build, reads in [*tables.BUILDERS.values(), *figures.BUILDERS.values()]:
        assert tuple(inspect.signature(build).parameters) == reads, build.__name__
        assert set(reads) <= roles, build.__name__


def test_the_top_level_help_and_every_subcommands_help_exit_0(capsys):
    """argparse formats help strings with %: a bare % in one help text crashed `--help`."""
    from moecache import cli

    top = cli.parser()
    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    for argv in [["--help"], *([name, "--help"] for name in commands.choices)]:
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 0, argv
    assert "usage: moecache" in capsys.readouterr().out


def test_the_replay_and_report_stages_import_no_torch():
    """Jobs that need no model (replay, bounds, tables, figures, the scorecard) start without
    torch or transformers: seconds a job on a pipeline of a hundred jobs."""
    import subprocess
    import sys

    modules = [
        "moecache.cli",
        "moecache.replay.engine",
        "moecache.replay.tiers",
        "moecache.replay.lp",
        "moecache.report.claims",
        "moecache.report.numbers",
        "moecache.report.figures",
        "moecache.report.tables.table1",
    ]
    code = "import sys; " + "; ".join(f"import {m}" for m in modules)
    code += "; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_command_given_a_trace_study_config_refuses_in_one_line():
    """config/trace.yaml has a trace and no model: a command that needs the model says so."""
    result = moecache("plan", "--configfile", str(Path(SMOKE).parent / "trace.yaml"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no model section" in lines[0] and "trace study" in lines[0]


def subcommands_taking_a_config() -> dict[str, argparse.ArgumentParser]:
    from moecache import cli

    top = cli.parser()
    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return {
        name: p
        for name, p in commands.choices.items()
        if {"--config", "--configfile"} & {o for a in p._actions for o in a.option_strings}
    }


def filled(p: argparse.ArgumentParser, folder: Path) -> list[str]:
    """Each required flag but the config's (and the first of a required group), given a
    value of its type (a path in `folder`)."""
    argv = []
    chosen = {g._group_actions[0] for g in p._mutually_exclusive_groups if g.required}
    for action in p._actions:
        flag = (action.option_strings or [""])[0]
        wanted = action.required or action in chosen
        if not wanted or flag in ("", "--config", "--configfile"):
            continue
        if action.choices:
            value = str(next(iter(action.choices)))
        elif action.type in (int, float):
            value = "1"
        else:
            value = str(folder / flag.strip("-"))
        argv += [flag, value]
    return argv


@pytest.mark.parametrize("name", sorted(subcommands_taking_a_config()))
def test_every_command_given_a_trace_study_config_answers_in_one_line(name, tmp_path, capsys):
    """config/trace.yaml has no model, corpus, harness or accuracy: a command that needs one
    refuses in one line naming the section, never a traceback; one that needs none runs."""
    p = subcommands_taking_a_config()[name]
    flag = "--config" if "--config" in {o for a in p._actions for o in a.option_strings} else None
    argv = [name, flag or "--configfile", str(Path(SMOKE).parent / "trace.yaml")]
    from moecache import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(argv + filled(p, tmp_path))
        raise SystemExit(0)
    lines = capsys.readouterr().err.strip().splitlines()
    if exit_.value.code:
        assert exit_.value.code == 2 and len(lines) == 1, lines
        assert lines[0].startswith("moecache: error: "), lines
