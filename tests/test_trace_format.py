"""The routing trace anyone can write: `moecache trace convert` from JSON lines round-trips
through `trace dump`, replays like a harness trace, and refuses bad input in one line
with exit status 2 and no output file."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moecache.records.demand import from_arrays
from moecache.replay import convert, engine, tracefile


def hook_log(requests: np.ndarray, names) -> list[dict]:
    """Rows as a serving hook logs them: per sequence, token after token, each through every
    layer. `requests` [sequences, layers, T, k]."""
    return [
        {"sequence": name, "layer": layer, "token": t, "experts": requests[s, layer, t].tolist()}
        for s, name in enumerate(names)
        for t in range(requests.shape[2])
        for layer in range(requests.shape[1])
    ]


def write_lines(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def moecache(*args):
    return subprocess.run(
        [sys.executable, "-m", "moecache", *map(str, args)], capture_output=True, text=True
    )


@st.composite
def logs(draw):
    k = draw(st.integers(1, 4))
    experts = draw(st.integers(k, 12))
    shape = (draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 9)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    requests = np.array(
        [rng.choice(experts, k, replace=False) for _ in range(int(np.prod(shape)))]
    ).reshape(*shape, k)
    return requests, experts, draw(st.integers(1, 40))


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(logs())
def test_convert_round_trips(tmp_path, drawn):
    """convert then dump gives back every row (grouped by stream); any row-group size."""
    requests, experts, group_rows = drawn
    names = [f"req-{s}" for s in range(len(requests))]
    rows = hook_log(requests, names)
    write_lines(tmp_path / "log.jsonl", rows)
    convert.convert(tmp_path / "log.jsonl", tmp_path / "t.parquet", experts, group_rows)
    back = [json.loads(line) for line in convert.dump(tmp_path / "t.parquet")]
    key = lambda r: (names.index(r["sequence"]), r["layer"], r["token"])  # noqa: E731
    assert back == sorted(rows, key=key)
    info = tracefile.header(tmp_path / "t.parquet")
    assert info == {
        "schema": "moecache-trace",
        "version": 1,
        "experts": experts,
        "top_k": requests.shape[3],
    }


def test_converted_trace_replays_like_the_demand(tmp_path):
    """Replay of the converted trace counts exactly what replay of the same arrays does."""
    rng = np.random.default_rng(1)
    requests = np.array([rng.choice(16, 2, replace=False) for _ in range(3 * 2 * 30)])
    requests = requests.reshape(3, 2, 30, 2)
    write_lines(tmp_path / "log.jsonl", hook_log(requests, ["a", "b", "c"]))
    convert.convert(tmp_path / "log.jsonl", tmp_path / "t.parquet", 16, group_rows=50)
    assert pq.ParquetFile(tmp_path / "t.parquet").num_row_groups > 1
    demand = tracefile.read_demand(tmp_path / "t.parquet")
    assert demand.streams[:2] == ["layer0/a", "layer1/a"]
    direct = from_arrays(requests.reshape(6, 30, 2), 16)
    for rule in ("lru", "fifo", "farthest-future"):
        ours = engine.run(demand, engine.make_rule(rule, demand, 6)).insertions
        assert (ours == engine.run(direct, engine.make_rule(rule, direct, 6)).insertions).all()
    done = moecache("replay", "--trace", tmp_path / "t.parquet", "--capacity", 6, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["streams"] == 6


BAD = [
    ('{"sequence": "a", "layer": 0, "token": 0, "experts": [0, 9]}', "outside 0..7"),
    ('{"sequence": "a", "layer": 0, "token": 0, "experts": [1, 1]}', "expert twice"),
    ('{"sequence": "a", "layer": 0, "token": 0, "experts": [1]}', "ragged"),
    ('{"sequence": "a", "layer": 0, "token": 2, "experts": [1, 2]}', "unsorted"),
    (
        '{"sequence": "b", "layer": 0, "token": 0, "experts": [1, 2]}\n'
        '{"sequence": "a", "layer": 0, "token": 1, "experts": [1, 2]}',
        "resumes",
    ),
    (
        '{"sequence": "a", "layer": 0, "token": 1, "experts": [1, 2]}\n'
        '{"sequence": "a", "layer": 1, "token": 0, "experts": [1, 2]}',
        "ragged, the layers",
    ),
    ('{"sequence": "a", "layer": 0, "token": 1}', "need exactly the keys"),
    ("not json", "not JSON"),
]


@pytest.mark.parametrize(("line", "message"), BAD)
def test_bad_input_is_one_line(tmp_path, line, message):
    """Ragged, out-of-range, repeated, unsorted or malformed input: one line naming the
    problem and its line, exit 2, no trace written."""
    good = '{"sequence": "a", "layer": 0, "token": 0, "experts": [3, 4]}\n'
    (tmp_path / "log.jsonl").write_text(good + line + "\n")
    done = moecache(
        "trace", "convert", tmp_path / "log.jsonl", "--experts", 8, "--out", tmp_path / "t.parquet"
    )
    assert done.returncode == 2
    assert message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert "log.jsonl:" in done.stderr
    assert list(tmp_path.iterdir()) == [tmp_path / "log.jsonl"]


def test_foreign_version_is_refused(tmp_path):
    (tmp_path / "log.jsonl").write_text(
        '{"sequence": "a", "layer": 0, "token": 0, "experts": [3, 4]}\n'
    )
    convert.convert(tmp_path / "log.jsonl", tmp_path / "t.parquet", 8)
    table = pq.read_table(tmp_path / "t.parquet")
    info = {**tracefile.header(tmp_path / "t.parquet"), "version": 99}
    pq.write_table(
        table.replace_schema_metadata({tracefile.META_KEY: json.dumps(info)}),
        tmp_path / "v99.parquet",
    )
    done = moecache("replay", "--trace", tmp_path / "v99.parquet", "--capacity", 4)
    assert done.returncode == 2 and "version 99" in done.stderr


def test_streamed_replay_equals_whole_replay(tmp_path):
    """Replaying a trace a few streams at a time (small batches, several row groups) gives
    the report of replaying it whole, stream for stream and rule for rule; so does the
    foresight curve and the bounds (mixed-precision costs drawn per layer across parts)."""
    from moecache.replay import bound, foresight, stream

    rng = np.random.default_rng(2)
    requests = np.array([rng.choice(12, 3, replace=False) for _ in range(5 * 3 * 40)])
    write_lines(tmp_path / "log.jsonl", hook_log(requests.reshape(5, 3, 40, 3), list("abcde")))
    convert.convert(tmp_path / "log.jsonl", tmp_path / "t.parquet", 12, group_rows=100)
    whole = engine.report(tracefile.read_demand(tmp_path / "t.parquet"), 5)
    parts = list(stream.batches(tmp_path / "t.parquet", tokens=70))
    assert len(parts) > 3 and all(len(p.streams) <= 2 for p in parts)
    assert stream.report(tmp_path / "t.parquet", 5, tokens=70) == whole
    curve = foresight.curve(tracefile.read_demand(tmp_path / "t.parquet"), 5, [1, 2], 2)
    assert stream.foresight(tmp_path / "t.parquet", 5, [1, 2], 2, tokens=70) == curve
    mixed = {"share": 0.5, "cost": 0.5, "seed": 3}
    bounds = bound.report(tracefile.read_demand(tmp_path / "t.parquet"), 5, mixed)
    streamed = stream.bounds(tmp_path / "t.parquet", 5, mixed, tokens=70)
    assert untimed(streamed) == untimed(bounds) and bounds["totals"]["greedy_optimal"]


def untimed(report):
    """A report without its seconds (timings differ run to run)."""
    if isinstance(report, dict):
        return {k: untimed(v) for k, v in report.items() if "seconds" not in k}
    return [untimed(v) for v in report] if isinstance(report, list) else report


def test_scale_benchmark_runs_small(tmp_path):
    """The production-scale benchmark on a tiny shape: every rule timed, its copies equal to
    replaying the same generated trace whole, memory measured."""
    from moecache.replay import scale

    shape = {"sequences": 3, "tokens": 20, "layers": 2, "experts": 16, "top_k": 2}
    report = scale.run(shape, 4, seed=1, folder=tmp_path)
    assert report["requests"] == 3 * 20 * 2 * 2 and report["peak_memory_bytes"] > 0
    path = tmp_path / "again.parquet"
    scale.write_trace(path, shape, seed=1)
    whole = engine.report(tracefile.read_demand(path), 4)
    assert set(report["rules"]) == set(whole["rules"])
    for rule, r in report["rules"].items():
        assert r["after_fill"] == whole["rules"][rule]["totals"]["after_fill"], rule


def test_lp_refuses_a_stream_too_large_and_points_to_the_proof(monkeypatch):
    """A stream longer than the LP takes is refused in one line that names it and points
    to farthest-future, optimal at unit cost."""
    from moecache.errors import MoecacheError
    from moecache.replay import bound

    rng = np.random.default_rng(3)
    demand = from_arrays(np.array([[rng.choice(8, 2, replace=False) for _ in range(30)]]), 8)
    monkeypatch.setattr(bound, "LP_MAX_REQUESTS", 59)
    with pytest.raises(MoecacheError) as caught:
        bound.report(demand, 4)
    message = str(caught.value)
    assert "instance-0: 60 requests, too large for the LP" in message and "\n" not in message
    assert "farthest-future" in message and "docs/optimum.md" in message
    monkeypatch.setattr(bound, "LP_MAX_REQUESTS", 60)
    assert bound.report(demand, 4)["totals"]["greedy_optimal"]
