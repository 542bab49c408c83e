"""The records' files: JSON with a `schema` version, written atomically and read back into
their records. Reading refuses, in one line naming the file and the field, a file of
another schema version or one that lacks a field (RecordError)."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from moecache.atomic import write_json
from moecache.errors import MoecacheError
from moecache.records import replay
from moecache.records.record import R, Record
from moecache.records.run import OPTIONAL, SCHEMA, RunResult, SequenceRow


class RecordError(MoecacheError):
    """A results file this moecache cannot read as its record: one line, file and field."""


def load(path: str | Path, what: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise RecordError(f"{path}: not {what} ({error})") from None
    if not isinstance(data, dict):
        raise RecordError(f"{path}: not {what} (not a JSON object)")
    return data


def check_schema(path, data: dict, what: str, schema: int) -> None:
    if "schema" not in data:
        raise RecordError(
            f"{path}: {what} without field schema (written by an older moecache? rerun its rule)"
        )
    if data["schema"] != schema:
        raise RecordError(
            f"{path}: {what} of schema {data['schema']!r}, this moecache reads schema {schema} "
            "(rerun its rule)"
        )


def lacking(data: dict, names, optional=()) -> str | None:
    """The first of `names` that `data` lacks (None: it has every one)."""
    return next((n for n in names if n not in data and n not in optional), None)


def read_run(path: str | Path) -> RunResult:
    """A decode run's results file (results/runs/<shard>/<label>.json) as its record."""
    what = "a decode run's results"
    data = load(path, what)
    check_schema(path, data, what, SCHEMA)
    missing = lacking(data, [f.name for f in fields(RunResult)], OPTIONAL)
    if missing:
        raise RecordError(f"{path}: {what} without field {missing} (rerun its rule)")
    row_fields = [f.name for f in fields(SequenceRow) if f.default is not None]
    if not isinstance(data["sequences"], list):
        raise RecordError(f"{path}: {what} whose field sequences is not a list")
    for i, row in enumerate(data["sequences"]):
        missing = lacking(row, row_fields)
        if missing:
            raise RecordError(f"{path}: {what} without field sequences[{i}].{missing}")
    named = {f.name for f in fields(SequenceRow)}
    rows = tuple(
        SequenceRow(**{k: v for k, v in row.items() if k in named}) for row in data["sequences"]
    )
    known = {f.name for f in fields(RunResult)}
    return RunResult(**{**{k: v for k, v in data.items() if k in known}, "sequences": rows})


def read_run_dict(path: str | Path) -> dict:
    """A decode run's results file checked as read_run checks it, as the file's dict (for
    the readers that sum its rows by key)."""
    return read_run(path).as_dict()


def write_run(path: str | Path, result: RunResult) -> dict:
    """`result` to `path`, whole or not at all; returns what was written."""
    data = result.as_dict()
    write_json(path, data)
    return data


def read_record(path: str | Path, kind: type[R]) -> R:
    """A results file as its record of `kind` (records/record.py's Record: the replay
    stage's files in records/replay.py, the harness's batched runs in records/run.py)."""
    data = load(path, kind.what)
    check_schema(path, data, kind.what, kind.version)
    names = [f.name for f in fields(kind)]
    missing = lacking(data, names, kind.optional)
    if missing:
        raise RecordError(f"{path}: {kind.what} without field {missing} (rerun its rule)")
    return kind(**{k: v for k, v in data.items() if k in names})


def read_dict(path: str | Path, kind: type[Record]) -> dict:
    """A results file checked as read_record checks it, as the file's dict
    (for the readers that index it by key)."""
    return read_record(path, kind).as_dict()


def read_replay(path: str | Path) -> replay.ReplayResult:
    """A trace replay's results file (`moecache replay --out`) as its record."""
    return read_record(path, replay.ReplayResult)


def read_replay_dict(path: str | Path) -> dict:
    """A trace replay's results file checked as read_replay checks it, as the file's dict."""
    return read_dict(path, replay.ReplayResult)


def write_record(path: str | Path | None, record: Record) -> dict:
    """`record` to `path` (None: nowhere), whole or not at all; returns
    what was written."""
    data = record.as_dict()
    if path is not None:
        write_json(path, data)
    return data
