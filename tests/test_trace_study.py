"""A study from a routing trace alone (`trace: PATH`, config/trace.yaml): the same routing
written in every importer's format converts to one trace, and `snakemake all` on it builds
replay, bounds with the LP optimum, foresight, batched replay, the sweep, the benchmark,
their tables and figures and the scorecard's replay claims, with no model stage."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import REPO, snakemake
from test_importers import megatron_records, policylang_lines, vllm_response, write_jsonl

from moecache import config as configs
from moecache.replay import convert, optimum

SEQUENCES, LAYERS, TOKENS, K, EXPERTS = 4, 2, 40, 2, 16


def routing() -> np.ndarray:
    """[sequences, tokens, layers, k], bursty like decoding."""
    rng = np.random.default_rng(0)
    layers = [optimum.generate(rng, "bursty", SEQUENCES, TOKENS, EXPERTS, K) for _ in range(LAYERS)]
    return np.stack(layers, axis=2)


def logs(folder, requests) -> dict[str, object]:
    """The routing in every format: {format: path}."""
    write_jsonl(
        folder / "vllm.jsonl",
        [vllm_response(f"seq{s}", requests[s]) for s in range(SEQUENCES)],
    )
    megatron = []
    for s in range(SEQUENCES):
        megatron += megatron_records(requests[s], s, [TOKENS // 2] + [1] * (TOKENS // 2))
    write_jsonl(folder / "router_trace_rank0.jsonl", megatron)
    write_jsonl(folder / "policylang.jsonl", policylang_lines(requests, EXPERTS))
    np.savez(folder / "trace.npz", **{f"seq{s}": requests[s] for s in range(SEQUENCES)})
    write_jsonl(
        folder / "moecache.jsonl",
        [
            {
                "sequence": f"seq{s}",
                "layer": layer,
                "token": t,
                "experts": requests[s, t, layer].tolist(),
            }
            for s in range(SEQUENCES)
            for t in range(TOKENS)
            for layer in range(LAYERS)
        ],
    )
    return {
        "vllm": folder / "vllm.jsonl",
        "megatron": folder / "router_trace_rank0.jsonl",
        "policylang": folder / "policylang.jsonl",
        "numpy": folder / "trace.npz",
        "moecache": folder / "moecache.jsonl",
    }


def study_config(trace: str) -> dict:
    config = yaml.safe_load((REPO / "config/trace.yaml").read_text())
    config["trace"] = trace
    config["capacity"] = 6
    config["replay"] |= {
        "heldout_sequences": 1,
        "capacities": [8],
        "batch_sizes": [1, 2],
        "foresight": [1, 2, 16],
        "optimum": {"instances": 30, "tokens": [4, 8], "shapes": [[6, 4, 1], [8, 6, 2]]},
        "benchmark": {
            "layers": 2,
            "sequences": 2,
            "mean_tokens": 20,
            "max_tokens": 30,
            "experts": 16,
            "top_k": 4,
            "capacity": 8,
            "rounds": 1,
        },
    }
    return config


def test_every_format_converts_to_the_same_trace(tmp_path):
    """One routing, five formats, one trace (streams in the same order, names aside)."""
    requests = routing()
    tables = {}
    for fmt, path in logs(tmp_path, requests).items():
        out = tmp_path / f"{fmt}.parquet"
        convert.convert(path, out, None if fmt == "policylang" else EXPERTS, fmt=fmt)
        tables[fmt] = pq.read_table(out).drop_columns(["sequence"])
    first = tables.pop("moecache")
    for fmt, table in tables.items():
        assert table.equals(first), fmt


@pytest.mark.pipeline
def test_a_trace_study_runs_all_without_a_model(tmp_path):
    requests = routing()
    convert.convert(
        logs(tmp_path, requests)["vllm"], tmp_path / "trace.parquet", EXPERTS, fmt="vllm"
    )
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study_config("trace.parquet")))
    snakemake(tmp_path, "all", "--cores", "1", configfile=tmp_path / "study.yaml")
    replay = json.loads((tmp_path / "results/replay/trace/replay.json").read_text())
    assert replay["streams"] == SEQUENCES * LAYERS and replay["capacity"] == 6
    bound = json.loads((tmp_path / "results/replay/trace/c8/bound.json").read_text())
    assert bound["totals"]["certified"] and bound["totals"]["greedy_optimal"]
    for name in ("table_eviction.md", "table_bounds.md", "fig2.pdf", "table_batching.md"):
        assert (tmp_path / "figures" / name).stat().st_size > 0, name
    assert (tmp_path / "results/replay/trace/batched/b2-static-p0.json").exists()
    assert (tmp_path / "results/replay/trace/c8/per-request.json").exists()
    claims = (tmp_path / "figures/claims.csv").read_text()
    assert "results/replay/trace/bound.json" in claims  # the replay claims read this trace
    for stage in ("model", "runs", "learned", "controller", "router_tuning", "accuracy"):
        assert not (tmp_path / "results" / stage).exists(), stage


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"harness": {}}, "config key harness: a study from a trace alone"),
        ({"capacity": 0}, "config key capacity"),
        ({"replay": {"capacities": [6]}}, "is the study's capacity already"),
    ],
)
def test_a_bad_trace_study_config_names_the_key(change, named):
    config = study_config("trace.parquet")
    for key, value in change.items():
        config[key] = {**config[key], **value} if key == "replay" else value
    with pytest.raises(configs.ConfigError, match=named):
        configs.validate(config)
