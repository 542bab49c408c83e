"""A replay command that starts fast (issue 50, point 6): `moecache replay`, `trace convert`
and `trace dump` import neither torch nor transformers, and a small per-request replay
neither numba nor pandas (their start-up alone is longer than the replay); the plain
per-request LRU and MIN count what the compiled kernels count. Speed itself is checked in
benchmark-per-request's record (`startup`), not here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from moecache.records import trace
from moecache.records import trace as harness_trace
from moecache.records.demand import Demand
from moecache.replay import engine, optimum, plain

NEVER = {"torch", "transformers"}
EXPERTS, TOP_K = 16, 4


def imported(*argv: str, cwd) -> set[str]:
    """The top-level packages `moecache argv` imports (python -X importtime's stderr: the
    module is the last `|` column)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "moecache", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in lines[1:]}


@pytest.fixture(scope="module")
def harness_file(tmp_path_factory):
    """A small harness trace: 3 sequences x 2 layers, rows shuffled."""
    rng = np.random.default_rng(0)
    rows = []
    for seq in (2, 0, 1):
        length = int(rng.integers(5, 12))
        for layer in (1, 0):
            for token in range(length):
                experts = rng.choice(EXPERTS, TOP_K, replace=False).tolist()
                probs = rng.random(EXPERTS).astype(np.float32)
                rows.append(
                    {
                        **{"sequence": seq, "layer": layer, "token": token},
                        **{"requested": experts, "used": experts, "copied": []},
                        **{"refreshed": False, "decide_seconds": 0.0, "probs": probs},
                    }
                )
    order = rng.permutation(len(rows))
    path = tmp_path_factory.mktemp("startup") / "a.parquet"
    harness_trace.write([rows[i] for i in order], path, {"run": "lru"})
    return path


def test_replay_per_request_imports_no_torch_numba_or_pandas(harness_file, tmp_path):
    argv = ("replay", "--trace", str(harness_file), "--capacity", "6", "--per-request")
    modules = imported(*argv, "--rule", "lru", cwd=tmp_path)
    assert modules.isdisjoint(NEVER | {"numba", "pandas", "scipy", "jsonschema"})


def test_replay_imports_no_torch(harness_file, tmp_path):
    argv = ("replay", "--trace", str(harness_file), "--capacity", "6", "--rule", "lru")
    assert imported(*argv, cwd=tmp_path).isdisjoint(NEVER)


def test_trace_convert_and_dump_import_no_torch(tmp_path):
    log = tmp_path / "log.jsonl"
    with log.open("w") as out:
        for token in range(4):
            row = {"sequence": "s", "layer": 0, "token": token, "experts": [token, token + 1]}
            out.write(json.dumps(row) + "\n")
    assert imported("trace", "convert", "--help", cwd=tmp_path).isdisjoint(NEVER)
    converted = ("trace", "convert", str(log), "--experts", "8", "--out", "t.parquet")
    assert imported(*converted, cwd=tmp_path).isdisjoint(NEVER)
    assert imported("trace", "dump", "t.parquet", cwd=tmp_path).isdisjoint(NEVER)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("capacity", [1, 3, 8])
@pytest.mark.parametrize("rule", plain.RULES)
def test_plain_counts_what_the_kernels_count(seed, capacity, rule):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 200, size=5)
    kind = ("bursty", "uniform")[seed % 2]
    requests = optimum.generate(rng, kind, len(lengths), int(lengths.max()) * 2, 12, 1)
    for s, n in enumerate(lengths):
        requests[s, n:] = -1
    demand = Demand([f"s{s}" for s in range(5)], ["q"] * 5, requests, lengths, 12)
    ours = plain.replay(rule, demand, capacity)
    theirs = engine.compiled(demand, engine.make_rule(rule, demand, capacity))
    assert np.array_equal(ours[0], theirs[0]) and np.array_equal(ours[1], theirs[1])


def test_a_harness_trace_reads_in_layer_sequence_token_order(harness_file):
    demand = trace.read_demand(harness_file, EXPERTS)
    assert demand.streams == [f"layer{layer}/seq{s}" for layer in (0, 1) for s in (0, 1, 2)]
    assert demand.probs.shape == (6, demand.requests.shape[1], EXPERTS)
    assert demand.origin == {"run": "lru"}
