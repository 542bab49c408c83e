"""The records layer: a decode run's results file and the replay stage's files round-trip
through records/io; another schema version or a missing field is refused in one line naming
the file and the field; nothing in it imports torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import run_records
from run_records import batched_record, bound_record, foresight_record, run_record, sweep_record

from moecache.errors import MoecacheError
from moecache.records.io import RecordError, read_run, write_run
from moecache.records.run import SCHEMA

ROW = {
    "sequence": 0,
    "tokens": 3,
    "nll_sum": 2.0,
    "scored": 2,
    "timed_tokens": 2,
    "step_seconds": 0.5,
    "copy_seconds": 0.1,
    "stall_seconds": 0.1,
    "timed_copies": 4,
    "copy_groups": 2,
    "fills": 8,
    "steady": 4,
    "step_repeats": [0.5],
    "copy_repeats": [0.1],
    "nll": 1.0,
}


def test_a_run_round_trips_and_keeps_its_file(tmp_path):
    path = tmp_path / "lru-x1.json"
    path.write_text(json.dumps(run_record(sequences=[ROW], sequences_decoded=[0])))
    result = read_run(path)
    assert result.schema == SCHEMA and result.blocking and result.label == "lru-x1"
    assert result.sequences[0].copy_busy_seconds == 0.1 == result.stall_seconds()
    again = tmp_path / "again.json"
    assert write_run(again, result) == json.loads(path.read_text())


def test_a_controller_runs_block_is_kept_last(tmp_path):
    """controller/evaluate.py annotates a sweep's run with its controller block after the
    run: read and written back, the block stays, last, as the annotated file had it."""
    block = {"refreshes_per_token": 0.5, "heads_share": 0.01}
    path = tmp_path / "c-x1.json"
    path.write_text(json.dumps({**run_record(sequences=[ROW]), "controller": block}))
    result = read_run(path)
    assert result.controller == block
    written = write_run(tmp_path / "again.json", result)
    assert list(written)[-1] == "controller" and written == json.loads(path.read_text())
    plain = tmp_path / "lru-x1.json"
    plain.write_text(json.dumps(run_record(sequences=[ROW])))
    assert "controller" not in read_run(plain).as_dict()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"schema": 2}, "of schema 2, this moecache reads schema 1"),
        ({"schema": None}, "without field schema"),
        ({"restricts": None}, "without field restricts"),
        ({"sequences": [{**ROW, "nll": None}]}, "without field sequences[0].nll"),
    ],
)
def test_another_schema_or_a_missing_field_is_one_line(tmp_path, change, says):
    data = run_record(sequences=[ROW])
    for key, value in change.items():
        data[key] = value
        if value is None:
            del data[key]
    for row in data["sequences"]:
        for key in [k for k, v in row.items() if v is None]:
            del row[key]
    path = tmp_path / "lru-x1.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError) as error:
        read_run(path)
    assert isinstance(error.value, MoecacheError)
    message = str(error.value)
    assert says in message and str(path) in message and "\n" not in message


def test_the_records_import_no_torch():
    code = "import sys, moecache.records.io, moecache.records.run; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_a_replay_without_its_schema_or_a_field_is_one_line(tmp_path):
    from moecache.records.io import read_replay
    from moecache.records.replay import stamped

    report = {"capacity": 4, "experts": 8, "top_k": 2, "streams": 1, "tokens": 5}
    path = tmp_path / "replay.json"
    path.write_text(json.dumps({**report, "timed_tokens": 4, "rules": {}}))
    with pytest.raises(RecordError, match="replay.json: a trace replay's results without field"):
        read_replay(path)
    path.write_text(json.dumps(stamped({**report, "rules": {}})))
    with pytest.raises(RecordError, match="without field timed_tokens"):
        read_replay(path)
    path.write_text(json.dumps(stamped({**report, "timed_tokens": 4, "rules": {}})))
    assert read_replay(path).counting is None and read_replay(path).capacity == 4


@pytest.mark.parametrize(
    ("kind", "record", "field"),
    [
        ("BoundResult", bound_record, "mixed_precision"),
        ("ForesightResult", foresight_record, "subsets"),
        ("OptimumSweep", sweep_record, "greedy_above_lru"),
        ("BatchedRunResult", batched_record, "lossless"),
    ],
)
def test_the_replay_and_batched_files_round_trip_and_refuse_a_missing_field(
    tmp_path, kind, record, field
):
    from moecache.records import replay, run
    from moecache.records.io import read_record, write_record

    kind = getattr(replay, kind, None) or getattr(run, kind)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(record()))
    assert write_record(None, read_record(path, kind)) == record()
    path.write_text(json.dumps({k: v for k, v in record().items() if k != field}))
    with pytest.raises(RecordError, match=f"r.json: {kind.what} without field {field} "):
        read_record(path, kind)
    path.write_text(json.dumps({**record(), "schema": 0}))
    with pytest.raises(RecordError, match="of schema 0, this moecache reads schema 1"):
        read_record(path, kind)


# Every other stage's file, its record and a field it cannot do without.
STAGE_FILES = [
    ("gates", "GatesResult", "gates_record", "batched_nll"),
    ("bandwidth", "BandwidthResult", "bandwidth_record", "tau_ms"),
    ("bandwidth", "LinkCheckResult", "link_record", "runs"),
    ("profile", "ProfileResult", "profile_record", "heldout_nll"),
    ("profile", "ProbeResult", "probe_record", "layers"),
    ("router_tuning", "TuningLog", "tuning_log_record", "greedy_sim_hit_rate"),
    ("router_tuning", "TunedModel", "tuned_record", "teacher_forced"),
    ("accuracy", "AccuracySummary", "accuracy_record", "rows"),
    ("controller", "HeadsLog", "heads_record", "log"),
    ("controller", "LongerSummary", "longer_record", "pieces"),
    ("training", "ModelTraining", "training_record", "parameters"),
    ("replay", "ReplayBenchmark", "benchmark_record", "inputs"),
    ("learned", "LearnedEvaluation", "learned_record", "shards"),
]


@pytest.mark.parametrize(("module", "kind", "record", "field"), STAGE_FILES)
def test_every_stage_file_round_trips_and_refuses_a_missing_field_or_schema(
    tmp_path, module, kind, record, field
):
    import importlib

    from moecache.records.io import read_record, write_record

    kind = getattr(importlib.import_module(f"moecache.records.{module}"), kind)
    data = getattr(run_records, record)()
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    written = write_record(tmp_path / "again.json", read_record(path, kind))
    assert written == data and list(written) == list(data)  # the file's order kept
    assert list(written)[0] == "schema"
    assert json.loads((tmp_path / "again.json").read_text()) == data
    path.write_text(json.dumps({k: v for k, v in data.items() if k != field}))
    with pytest.raises(RecordError, match=f"r.json: {kind.what} without field {field} "):
        read_record(path, kind)
    path.write_text(json.dumps({k: v for k, v in data.items() if k != "schema"}))
    with pytest.raises(RecordError, match=f"r.json: {kind.what} without field schema"):
        read_record(path, kind)
    path.write_text(json.dumps({**data, "schema": 2}))
    with pytest.raises(RecordError, match="of schema 2, this moecache reads schema 1"):
        read_record(path, kind)


def test_a_stamped_file_keeps_the_stamp_last_and_leaves_out_an_absent_optional_field(tmp_path):
    """provenance.write_results with a record kind: the schema first, the report's fields in
    their order, the stamp last (the profile's own device where the profile set it); the
    gates' throughput ratio, absent when the reference is left out, stays absent."""
    from moecache import provenance
    from moecache.records.gates import GatesResult
    from moecache.records.io import read_record
    from moecache.records.profile import ProfileResult

    gates = run_records.gates_record(reference_left_out="all")
    for key in ("schema", *run_records.STAMP, "throughput_ratio_pool_vs_own_block"):
        gates.pop(key)
    gates.pop("throughput_ratio_ci")
    report = dict(gates)
    path = tmp_path / "gates.json"
    written = provenance.write_results(path, report, {"seed": 0}, "cpu", kind=GatesResult)
    stamp = ["settings", "settings_hash", "versions", "device", "device_name"]
    assert list(written) == ["schema", *gates, *stamp]
    assert list(json.loads(path.read_text())) == list(written)
    assert read_record(path, GatesResult).throughput_ratio_ci is None
    profile = run_records.profile_record()
    assert list(ProfileResult(**profile).as_dict())[:3] == ["schema", "device", "expert_bytes"]
