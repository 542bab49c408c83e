"""The tiers measured in the harness (issue 40 point 3): the tiered block's counts equal
the tiered replay's on the demand it decoded, both admissions, H < N; the model's output is
unchanged; a disk read returns the expert's bytes and falls back without O_DIRECT; the
tier equation and the record."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from test_router_tuning import EXPERTS, TOP_K, tiny_model

from moecache import config as configs
from moecache.costs import tier_equation
from moecache.errors import MoecacheError
from moecache.harness import disk_pool, tier_record, tier_runs
from moecache.harness.pool import HostExperts
from moecache.records.demand import Demand, padded
from moecache.records.io import RecordError, read_record, write_record
from moecache.records.tiers_measured import TiersMeasuredResult
from moecache.replay import tiers as replay_tiers

REPO = Path(__file__).resolve().parents[1]
LAYERS, CAPACITY, HOST = 2, 3, 5  # the tiny model's layers; C < H < N


def tiny_settings(**harness) -> dict:
    return {
        "seed": 0,
        "model": {"architecture": {"num_experts": EXPERTS, "num_experts_per_tok": TOP_K}},
        "harness": configs.with_defaults(
            {
                "device": "cpu",
                "restricted_layers": [0, 1],
                "capacity": CAPACITY,
                "tiers": {"host": HOST, "sequences": 3, "tokens": 20, "repeats": 2} | harness,
            },
            "harness",
        ),
    }


def sequences(count=3, length=20, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 64, size=length).tolist() for _ in range(count)]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    settings = tiny_settings()
    folder = tmp_path_factory.mktemp("tiers")
    return settings, tier_runs.measure(tiny_model(), sequences(), settings, folder)


def demand_of(streams: dict) -> tuple[Demand, list]:
    """The demand the harness decoded, one stream per (layer, sequence)."""
    keys = sorted(streams)
    tokens = [np.asarray(streams[key]["requests"], dtype=np.int64) for key in keys]
    requests, lengths = padded(tokens, TOP_K)
    names = [f"layer{layer}/seq{s}" for layer, s in keys]
    return Demand(names, [f"seq{s}" for _, s in keys], requests, lengths, EXPERTS), keys


@pytest.mark.parametrize("admission", ["always", "bypass"])
def test_the_harness_counts_what_the_tiered_replay_counts(measured, admission):
    """Copies, steady copies, disk reads and host computes, per stream (layer x sequence),
    equal replay/tiers.py's on the requests the decode made, C < H < N."""
    _, m = measured
    streams = m.timed[admission]["streams"]
    demand, keys = demand_of(streams)
    replayed = replay_tiers.run(demand, "lru", CAPACITY, HOST, "lru", admission)
    for i, key in enumerate(keys):
        counts = streams[key]["counts"]
        for event in ("copies", "steady", "reads", "computes"):
            assert counts[event] == getattr(replayed, event)[i], (key, event)
    assert sum(streams[key]["counts"]["reads"] for key in keys) > 0
    if admission == "bypass":
        assert sum(streams[key]["counts"]["computes"] for key in keys) > 0
    else:
        assert all(streams[key]["counts"]["computes"] == 0 for key in keys)


def test_every_arm_decodes_what_the_model_decodes(measured):
    """Experts moved through the disk and the host cache, or computed on the host, give
    the all-resident reference's NLL; the demand is the same for every arm."""
    _, m = measured
    reference = m.timed[tier_runs.RESIDENT]
    for admission in ("always", "bypass"):
        arm = m.timed[admission]
        assert arm["nll"] == pytest.approx(reference["nll"], abs=1e-5)
        for key, stream in arm["streams"].items():
            assert stream["requests"] == reference["streams"][key]["requests"]


def test_the_resident_reference_moves_nothing(measured):
    _, m = measured
    for stream in m.timed[tier_runs.RESIDENT]["streams"].values():
        assert stream["counts"] == {"copies": 0, "steady": 0, "reads": 0, "computes": 0}


def test_the_report_predicts_each_arm_with_the_tier_equation(measured):
    """Predicted from c, the arm's bookkeeping and its counts at the prices the decode
    timed (and, beside, at those measured apart); the run's prices are its events' own."""
    settings, m = measured
    record = tier_record.report(settings, m)
    c = record["resident"]["c_ms_per_token"]
    apart = {key: row["ms"] for key, row in record["prices"].items()}
    timed = record["run_prices"]
    for row in record["admissions"].values():
        extra = row["bookkeeping_ms_per_token"] - record["resident"]["bookkeeping_ms_per_token"]
        expected = tier_equation.tier_ms_per_token(c, record["tokens"], row, timed, extra)
        assert row["predicted_ms_per_token"] == pytest.approx(expected)
        assert row["ratio"] == pytest.approx(expected / row["ms_per_token"])
        assert row["within_10pct"] == (abs(row["ratio"] - 1) <= 0.10)
        beside = tier_equation.tier_ms_per_token(c, record["tokens"], row, apart, extra)
        assert row["predicted_from_prices_apart_ms_per_token"] == pytest.approx(beside)
        assert sum(r["reads"] for r in row["streams"]) == row["reads"]
        low, high = row["ms_per_token_ci"]
        assert low <= row["ms_per_token"] <= high
    bypass = record["admissions"]["bypass"]
    assert bypass["timed_in_run_ms"]["host_compute_ms"] == pytest.approx(timed["host_compute_ms"])
    assert all(timed[key] > 0 for key in timed)
    # c: the reference's step with its device computes at the pools' price
    reference = m.timed[tier_runs.RESIDENT]["streams"].values()
    seconds = sum(np.mean([t["device_seconds"] for t in s["times"]]) for s in reference)
    computes = sum(s["device_computes"] for s in reference)
    assert computes == 3 * 20 * TOP_K * LAYERS
    shift = (computes * timed["device_compute_ms"] - 1e3 * seconds) / record["tokens"]
    assert c == pytest.approx(record["resident"]["ms_per_token"] + shift)
    assert record["tokens"] == 3 * 20 and record["shared_processor"]
    assert record["gpu_check"]["committed"] is False


def test_the_record_round_trips_and_refuses_a_missing_field(measured, tmp_path):
    settings, m = measured
    stamp = {"settings": settings, "settings_hash": "x", "versions": {}}
    stamp |= {"device": "cpu", "device_name": "cpu"}
    record = TiersMeasuredResult(**tier_record.report(settings, m), **stamp)
    path = tmp_path / "r.json"
    write_record(path, record)
    assert read_record(path, TiersMeasuredResult) == record
    data = json.loads(path.read_text())
    del data["admissions"]
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="without field admissions"):
        read_record(path, TiersMeasuredResult)


def test_the_check_fails_when_an_arm_is_not_within(measured):
    settings, m = measured
    record = tier_record.report(settings, m)
    for row in record["admissions"].values():
        row["within_10pct"] = True
    assert tier_record.check_lines(record)[1]
    record["admissions"]["bypass"]["within_10pct"] = False
    lines, ok = tier_record.check_lines(record)
    assert not ok and "NOT within 10%" in lines[-1]


def test_the_tier_equation_adds_a_term_per_tier():
    prices = {"host_to_device_ms": 0.5, "disk_to_host_ms": 5.0, "host_compute_ms": 0.3}
    counts = {"copies": 10, "reads": 4, "computes": 6}
    assert tier_equation.tier_ms_per_token(2.0, 10, counts, prices) == pytest.approx(
        2.0 + (10 * 0.5 + 4 * 5.0 + 6 * 0.3) / 10
    )
    prices["device_compute_ms"] = 0.1  # a computed miss saves the device's own matvec
    assert tier_equation.tier_ms_per_token(2.0, 10, counts, prices) == pytest.approx(
        2.0 + (10 * 0.5 + 4 * 5.0 + 6 * 0.2) / 10
    )
    assert tier_equation.tier_ms_per_token(2.0, 10, counts, prices, 0.4) == pytest.approx(
        2.4 + (10 * 0.5 + 4 * 5.0 + 6 * 0.2) / 10
    )
    with pytest.raises(MoecacheError, match="at least one token"):
        tier_equation.tier_ms_per_token(2.0, 0, counts, prices)


@pytest.fixture
def expert_file(tmp_path):
    model = tiny_model()
    hosts = {
        layer: HostExperts(model.model.layers[layer].mlp.experts, EXPERTS, "cpu")
        for layer in range(LAYERS)
    }
    path = tmp_path / "experts.safetensors"
    disk_pool.write_experts(path, hosts)
    return path, hosts


@pytest.mark.parametrize("direct", [True, False])
def test_a_disk_read_returns_the_experts_weights(expert_file, monkeypatch, direct):
    """Every expert read from the file into the host cache holds its weights, with O_DIRECT
    and, where the system has none, after posix_fadvise (said in one logged line)."""
    path, hosts = expert_file
    lines = []
    if not direct:
        monkeypatch.delattr(os, "O_DIRECT", raising=False)
    disk = disk_pool.DiskExperts(path, log=lines.append)
    try:
        assert disk.mode == (disk_pool.DIRECT if direct else disk_pool.FADVISE)
        assert bool(lines) == (not direct)
        for layer, host in hosts.items():
            cache = disk_pool.HostCache(host, HOST, layer, disk)
            for e in (7, 0, 3):
                assert cache.read(e) > 0
                for name, weight in cache.tensors(e).items():
                    assert torch.equal(weight, host.host[name][e])
    finally:
        disk.close()


def test_a_host_outside_its_bounds_is_refused_in_one_line():
    message = "harness.tiers.host 2: capacity 3 is larger than host 2"
    with pytest.raises(MoecacheError, match=message):
        tier_runs.settings_of(tiny_settings(host=2))


def test_a_rule_that_reads_the_future_is_refused():
    with pytest.raises(MoecacheError, match="read only past requests"):
        tier_runs.causal_rule("farthest-future", CAPACITY, EXPERTS, TOP_K)


def test_the_schema_takes_the_harness_keys_and_refuses_a_bad_one():

    settings = configs.load(REPO / "config/config.yaml")
    harness = {"host": 32, "admissions": ["always", "bypass"], "sequences": 2, "tokens": 32}
    configs.validate_schema({**settings, "harness": settings["harness"] | {"tiers": harness}})
    bad = settings["harness"] | {"tiers": {"admissions": ["never"]}}
    with pytest.raises(configs.ConfigError, match="admissions"):
        configs.validate_schema({**settings, "harness": bad})


def test_the_tiers_table_shows_the_measured_arms_and_their_check(measured, tmp_path):
    from moecache.report import tiers_measured

    settings, m = measured
    stamp = {"settings": settings, "settings_hash": "x", "versions": {}}
    stamp |= {"device": "cpu", "device_name": "cpu"}
    fields = tier_record.report(settings, m)
    record = TiersMeasuredResult(**fields, **stamp)
    rows = tiers_measured.frame(record)
    assert list(rows["arm"]) == ["all resident", *fields["admissions"]]
    for admission, arm in fields["admissions"].items():
        row = rows[rows["arm"] == admission].iloc[0]
        assert (row["copies"], row["reads"], row["computes"]) == (
            arm["copies"],
            arm["reads"],
            arm["computes"],
        )
    fields["admissions"]["bypass"]["ratio"] = 1.2  # a prediction 20% off
    lines = tiers_measured.lines(TiersMeasuredResult(**fields, **stamp))
    assert "Admission bypass" in lines[2] and lines[2].endswith("not within 10%.")


def test_the_measured_lines_price_the_device_side_by_a_committed_gpu_check():
    from moecache.report import tiers_measured

    priced = {"committed": True, "device_name": "G", "tau_ms": 0.25}
    priced |= {"host_compute_ms_scaled": 2.5, "host_compute_to_copy": 10.0}
    assert "costs 10.0 copies" in tiers_measured.gpu_lines(priced)[0]
    none = {"committed": False, "note": "no GPU check file is committed"}
    assert "not priced by a GPU" in tiers_measured.gpu_lines(none)[0]


def test_the_tiers_decode_on_the_cuda_path_as_on_the_cpu(measured, tmp_path):
    """The tiered harness rehearsed on the CUDA path (gpu.py): the same moves and NLL."""
    from moecache import gpu

    settings, cpu = measured
    with gpu.rehearse():
        cuda = tier_runs.measure(tiny_model(), sequences(), settings, tmp_path)
    for arm, timed in cpu.timed.items():
        assert cuda.timed[arm]["nll"] == pytest.approx(timed["nll"], abs=1e-6), arm
        for key, stream in timed["streams"].items():
            moves = {k: v for k, v in stream.items() if k != "times"}
            theirs = cuda.timed[arm]["streams"][key]
            assert {k: theirs[k] for k in moves} == moves, (arm, key)
