"""Overlapped runs in the decode stage: `overlap: true` and `prefetch: NAME` on a run of
harness.runs decode with asynchronous copies beside the blocking runs, keep the lossless
NLL, write their counts, and fill Table 1's overlapped part (equation (1) leaves them out);
a bad combination is refused in one line."""

from __future__ import annotations

import copy
import json
import random

import pytest
from conftest import REPO, load_settings
from run_records import bandwidth_record, gates_record

from moecache import config as configs
from moecache.config import run_spec
from moecache.harness import jobs
from moecache.model import tiny
from moecache.records.io import read_run
from moecache.records.run import SCHEMA
from moecache.report.tables import overlap as overlap_part
from moecache.report.tables import table1 as build_table1

RUNS = {
    "all": run_spec("all", capacity=16),
    "lru": run_spec("lru", multipliers=[1, 10]),
    "lru-pregate": run_spec("lru", overlap=True, prefetch="pregate", multipliers=[1, 10]),
    "ff-oracle": run_spec("farthest-future", overlap=True, prefetch="oracle"),
    "dwell-overlap": run_spec("dwell", {"k": 4, "window": 8}, overlap=True),
}


@pytest.mark.parametrize(
    ("run", "message"),
    [
        (
            run_spec("lru", prefetch="pregate"),
            "config key harness.runs.x.prefetch: prefetching needs overlap: true",
        ),
        (
            run_spec("lru", overlap=True, prefetch="psychic"),
            "config key harness.runs.x.prefetch: prefetch 'psychic': not one of",
        ),
        (
            run_spec("dwell", overlap=True, prefetch="pregate"),
            "config key harness.runs.x.prefetch: pregate needs a lossless eviction rule",
        ),
    ],
)
def test_a_bad_overlapped_run_is_refused_in_one_line(smoke_config, run, message):
    smoke_config["harness"]["runs"]["x"] = run
    with pytest.raises(configs.ConfigError) as error:
        configs.check(smoke_config)
    assert len(str(error.value).splitlines()) == 1
    assert str(error.value).startswith(message)


@pytest.fixture(scope="module")
def decoded(tmp_path_factory):
    """Shard a of a seeded random model of the smoke sizes, every run of RUNS decoded in
    one job (blocking and overlapped interleaved), and its results files."""
    config = load_settings(REPO / "config" / "smoke.yaml")
    config["harness"] |= {"runs": copy.deepcopy(RUNS), "scaled_sequences": 2}
    arch = config["model"]["architecture"]
    model = tiny.model("olmoe", arch, 512, seed=0)
    draw = random.Random(0)
    sequences = [[draw.randrange(512) for _ in range(20)] for _ in range(3)]
    out = tmp_path_factory.mktemp("decode")
    gates_file = out / "gates.json"
    gates_file.write_text(json.dumps(gates_record()))
    jobs.run_decode(config, None, None, "a", "a", gates_file, out, loaded=(model, sequences))
    return {path.stem: json.loads(path.read_text()) for path in out.glob("*-x*.json")}, out


def test_overlapped_lossless_runs_keep_the_nll_and_count_apart(decoded):
    reports, _ = decoded
    pairs = {"lru-pregate-x1": "lru-x1", "ff-oracle-x1": "lru-x1", "lru-pregate-x10": "lru-x10"}
    for label, blocking in pairs.items():
        report, totals = reports[label], reports[label]["totals"]
        assert report["overlap"] and report["prefetch"] in ("pregate", "oracle")
        # At 1x an overlapped run decodes the scaled runs' first sequences: compare those.
        nll = {row["sequence"]: row["nll"] for row in reports[blocking]["sequences"]}
        for row in report["sequences"]:
            assert row["nll"] == pytest.approx(nll[row["sequence"]], abs=1e-9)
        assert totals["timed_copies"] == totals["demand_copies"] + totals["prefetch_copies"]
        assert totals["prefetch_used"] + totals["prefetch_wasted"] <= totals["prefetch_copies"]
        assert totals["stall_ms"] >= 0 and totals["hidden_copy_ms"] >= 0
    assert reports["ff-oracle-x1"]["totals"]["prefetch_accuracy"] == 1.0
    assert reports["ff-oracle-x1"]["trace_in"] == "lru-x1"  # the oracle reads the trace
    assert not reports["lru-x1"]["overlap"] and "stall_ms" not in reports["lru-x1"]["totals"]


def test_table1_puts_overlapped_runs_apart_from_equation_one(decoded, tmp_path):
    reports, out = decoded
    runs = sorted(out.glob("*-x1.json"))
    scaled = sorted(p for p in out.glob("*-x10.json"))
    bandwidth = tmp_path / "bandwidth.json"
    measured = {"1": {"tau_ms": 0.01, "ratio_to_1x": 1}, "10": {"tau_ms": 0.1, "ratio_to_1x": 10}}
    bandwidth.write_text(
        json.dumps(
            bandwidth_record(device_name="cpu", tau_ms=0.01, loop_gib_per_s=1, multipliers=measured)
        )
    )
    table = build_table1(runs, scaled, [bandwidth])
    part = table.parts["overlapped"]
    assert set(part["run"]) == {"lru-pregate", "ff-oracle", "dwell-overlap"}
    at_10x = part[part["multiplier"] == 10].iloc[0]
    assert at_10x["blocking_run"] == "lru" and at_10x["prefetch"] == "pregate"
    assert set(table.parts["cost_model"]["run"]) == {"lru"}  # blocking runs only
    assert overlap_part.blocking_twin(reports["ff-oracle-x1"], [reports["lru-x1"]]) is None


def test_the_results_files_are_records_that_tell_blocking_from_overlapped(decoded):
    """Each file reads back as a RunResult: overlapped or blocking, restricting or not, the
    sequences it decoded, and the compute's stalls apart from the copies' own time."""
    _, out = decoded
    found = {path.stem: read_run(path) for path in out.glob("*-x*.json")}
    assert found["lru-x1"].blocking and not found["lru-x1"].restricts
    assert found["dwell-overlap-x1"].overlapped and found["dwell-overlap-x1"].restricts
    # At 1x an overlapped run decodes the scaled runs' sequences, a blocking one all three.
    assert found["lru-x1"].sequences_decoded == [0, 1, 2]
    assert found["lru-pregate-x1"].sequences_decoded == [0, 1]
    for row in found["lru-x1"].sequences:  # a blocking run's compute waits on every copy
        assert row.stall_seconds == row.copy_seconds == row.copy_busy_seconds
    for row in found["lru-pregate-x1"].sequences:  # an overlapped one hides some of it
        assert row.copy_busy_seconds == row.stall_seconds + row.hidden_copy_seconds
    written = json.loads((out / "lru-x1.json").read_text())
    assert written["schema"] == SCHEMA and "layers" not in written["sequences"][0]
