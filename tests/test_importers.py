"""`moecache trace convert --from FORMAT`: each importer reads a small file written in its
tool's exact format into the trace that holds the same routing; malformed input is one
line, exit 2 and no file; files are read incrementally and long sequences spill to disk."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from moecache.errors import MoecacheError
from moecache.replay import convert, importers, tracefile

LAYERS, TOKENS, K, EXPERTS = 3, 7, 2, 8


def routing(seed: int, sequences: int = 2) -> np.ndarray:
    """[sequences, tokens, layers, k] distinct expert ids per token."""
    rng = np.random.default_rng(seed)
    draws = [rng.choice(EXPERTS, K, replace=False) for _ in range(sequences * TOKENS * LAYERS)]
    return np.array(draws).reshape(sequences, TOKENS, LAYERS, K)


def converted(path, fmt, experts=EXPERTS, **options) -> dict[tuple[str, int], np.ndarray]:
    """{(sequence, layer): requests [T, k]} of the trace converted from `path`."""
    out = path.parent / "t.parquet"
    convert.convert(path, out, experts, fmt=fmt, **options)
    return {(s, layer): r for s, layer, r in tracefile.streams(out)}


def expected(requests: np.ndarray, names) -> dict[tuple[str, int], np.ndarray]:
    return {
        (name, layer): requests[s, :, layer]
        for s, name in enumerate(names)
        for layer in range(requests.shape[2])
    }


def same(got: dict, want: dict) -> bool:
    return list(got) == list(want) and all(np.array_equal(got[k], want[k]) for k in want)


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def vllm_response(name: str, requests: np.ndarray) -> dict:
    """A chat completion as vLLM's OpenAI-compatible server returns it with
    --enable-return-routed-experts: the choice's routed_experts [tokens][layers][k]."""
    return {
        "id": name,
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "..."},
                "finish_reason": "length",
                "token_ids": None,
                "routed_experts": requests.tolist(),
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": TOKENS},
    }


def test_vllm(tmp_path):
    requests = routing(1)
    write_jsonl(tmp_path / "v.jsonl", [vllm_response(f"chatcmpl-{s}", requests[s]) for s in (0, 1)])
    got = converted(tmp_path / "v.jsonl", "vllm")
    assert same(got, expected(requests, ["chatcmpl-0/0", "chatcmpl-1/0"]))


def test_vllm_offline_outputs(tmp_path):
    """RequestOutputs of the offline API written as JSON: request_id, outputs[].routed_experts."""
    requests = routing(2, 1)
    row = {"request_id": "7", "outputs": [{"index": 0, "routed_experts": requests[0].tolist()}]}
    write_jsonl(tmp_path / "v.jsonl", [row])
    assert same(converted(tmp_path / "v.jsonl", "vllm"), expected(requests, ["7/0"]))


def megatron_records(requests: np.ndarray, rank: int, per_step) -> list[dict]:
    """Megatron-LM's router trace: per step (prefill, then decode steps) every layer's
    record, as RouterTracer writes router_trace_rank{rank}.jsonl."""
    rows, start = [], 0
    for step, count in enumerate(per_step):
        for layer in range(requests.shape[1]):
            top = requests[start : start + count, layer]
            rows.append(
                {
                    "step": step,
                    "stage": "pre_dispatch",
                    "block": "decoder",
                    "layer": layer,
                    "rank": rank,
                    "num_tokens": count,
                    "topk": K,
                    "top_indices": top.tolist(),
                }
            )
        rows.append({**rows[-1], "block": "mtp", "mtp_idx": 0, "layer": 0})  # skipped
        start += count
    return rows


def test_megatron(tmp_path):
    requests = routing(3)
    rows = megatron_records(requests[0], 0, [4, 1, 1, 1]) + megatron_records(
        requests[1], 1, [3, 2, 2]
    )
    write_jsonl(tmp_path / "router_trace_rank0.jsonl", rows)
    got = converted(tmp_path / "router_trace_rank0.jsonl", "megatron")
    assert same(got, expected(requests, ["rank0", "rank1"]))


def policylang_lines(requests: np.ndarray, experts: int = EXPERTS) -> list[dict]:
    """moe-policylang's TraceRecording.save_jsonl: a header, then per prompt, per layer
    hook call, its tokens ({"p", "t", "l", "e", "s"})."""
    prompts, tokens, layers, k = requests.shape
    header = {
        "model_name": "m",
        "num_layers": layers,
        "num_experts": experts,
        "top_k": k,
        "num_entries": prompts * tokens * layers,
        "records_full_softmax": False,
    }
    rows = [
        {"p": p, "t": t, "l": layer, "e": requests[p, t, layer].tolist(), "s": [0.6, 0.4]}
        for p in range(prompts)
        for layer in range(layers)
        for t in range(tokens)
    ]
    return [header, *rows]


def test_policylang(tmp_path):
    requests = routing(4)
    write_jsonl(tmp_path / "p.jsonl", policylang_lines(requests))
    got = converted(tmp_path / "p.jsonl", "policylang", experts=None)
    assert same(got, expected(requests, ["0", "1"]))


def test_policylang_as_its_recorder_saves(tmp_path):
    """The same file written by moe-policylang's own TraceRecording (when installed)."""
    recorder = pytest.importorskip("moe_policylang.integrations.trace_recorder")
    requests = routing(5)
    entries = [
        recorder.TraceEntry(p, t, layer, requests[p, t, layer].tolist(), [0.5, 0.5])
        for p in range(2)
        for t in range(TOKENS)
        for layer in range(LAYERS)
    ]
    recording = recorder.TraceRecording("m", LAYERS, EXPERTS, K, entries)
    recording.save_jsonl(tmp_path / "p.jsonl")
    got = converted(tmp_path / "p.jsonl", "policylang", experts=None)
    assert same(got, expected(requests, ["0", "1"]))


def test_numpy_npy_and_npz(tmp_path, monkeypatch):
    """A .npy array is one sequence (its stem), each array of a .npz one (its key); read a
    few tokens at a time."""
    monkeypatch.setattr(importers, "CHUNK_TOKENS", 3)
    requests = routing(6)
    np.save(tmp_path / "seq.npy", requests[0].astype(np.int16))
    assert same(converted(tmp_path / "seq.npy", "numpy"), expected(requests[:1], ["seq"]))
    np.savez_compressed(tmp_path / "both.npz", first=requests[0], second=requests[1])
    got = converted(tmp_path / "both.npz", "numpy")
    assert same(got, expected(requests, ["first", "second"]))


def bad_cases(tmp_path):
    """(path, format, message) for malformed input of every format."""
    good = routing(7)[0]
    cases = []

    def case(name, fmt, message, rows=None, array=None):
        path = tmp_path / name
        if array is not None:
            np.save(path, array, allow_pickle=True)
        else:
            write_jsonl(path, rows)
        cases.append((path, fmt, message))

    wide = vllm_response("a", good)
    wide["choices"][0]["routed_experts"][3][1] = [1, 2, 3]
    case("v1.jsonl", "vllm", "ragged", [wide])
    null = vllm_response("a", good)
    null["choices"][0]["routed_experts"] = None
    case("v2.jsonl", "vllm", "--enable-return-routed-experts", [null])
    case("v3.jsonl", "vllm", "not a vLLM response", [{"text": "hi"}])
    out = vllm_response("a", good)
    out["choices"][0]["routed_experts"][0][0] = [0, 8]
    case("v4.jsonl", "vllm", "outside 0..7", [out])
    twice = megatron_records(good, 0, [4, 3])
    twice[1]["top_indices"][0] = [5, 5]
    case("m1.jsonl", "megatron", "expert twice", twice)
    short = megatron_records(good, 0, [4, 3])
    short[0]["num_tokens"] = 5
    case("m2.jsonl", "megatron", "not [num_tokens=5]", short)
    ragged = megatron_records(good, 0, [4, 3])[:-2]  # the last step lacks a layer
    case("m3.jsonl", "megatron", "ragged, the layers", ragged)
    case("m4.jsonl", "megatron", "no top_indices", [{"layer": 0, "rank": 0}])
    lines = policylang_lines(routing(8))
    lines[5]["t"] = 3
    case("p1.jsonl", "policylang", "unsorted", lines)
    case("p2.jsonl", "policylang", "trace header", [{"p": 0}])
    interleaved = policylang_lines(routing(8))
    interleaved.insert(2, interleaved.pop(-1))
    case("p3.jsonl", "policylang", "unsorted", interleaved)
    case("n1.npy", "numpy", "must be integers", array=good.astype(np.float32))
    case("n2.npy", "numpy", "not [tokens, layers, k]", array=good[:, 0])
    case("n3.npy", "numpy", "must be integers", array=np.array([[[None]]], dtype=object))
    case("n4.npy", "numpy", "outside 0..7", array=good + 4)
    (tmp_path / "n5.npy").write_bytes(b"\x93NUMPY garbage")
    cases.append((tmp_path / "n5.npy", "numpy", "not a NumPy array"))
    return cases


def test_malformed_input_is_one_line(tmp_path):
    for path, fmt, message in bad_cases(tmp_path):
        with pytest.raises(MoecacheError) as caught:
            convert.convert(path, tmp_path / "out" / "t.parquet", EXPERTS, fmt=fmt)
        text = str(caught.value)
        assert message in text and "\n" not in text, (path.name, text)
        assert str(path) in text or fmt == "policylang" and "--experts" in text, text
        assert not list((tmp_path / "out").iterdir()), path.name


def test_cli_from_and_a_one_line_error(tmp_path):
    requests = routing(9)
    write_jsonl(tmp_path / "p.jsonl", policylang_lines(requests))
    run = [sys.executable, "-m", "moecache", "trace", "convert", tmp_path / "p.jsonl"]
    done = subprocess.run(
        [*map(str, run), "--from", "policylang", "--out", str(tmp_path / "t.parquet")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "2 sequences, top-2 of 8 experts" in done.stdout
    done = subprocess.run(
        [*map(str, run), "--from", "vllm", "--out", str(tmp_path / "u.parquet")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--experts" in done.stderr and not (tmp_path / "u.parquet").exists()


def test_long_sequences_spill_and_convert_the_same(tmp_path):
    """A Megatron rank (one sequence of the whole run) held past spill_rows goes to disk
    layer by layer and converts to the same trace, in several row groups."""
    requests = routing(10)
    rows = megatron_records(requests[0], 0, [4, 1, 1, 1]) + megatron_records(
        requests[1], 1, [3, 2, 2]
    )
    write_jsonl(tmp_path / "m.jsonl", rows)
    whole = converted(tmp_path / "m.jsonl", "megatron")
    spilled = converted(tmp_path / "m.jsonl", "megatron", spill_rows=2, group_rows=2)
    assert same(spilled, whole) and same(whole, expected(requests, ["rank0", "rank1"]))


def test_numpy_converts_in_bounded_memory(tmp_path, monkeypatch):
    """A NumPy trace many times the memory the conversion may hold: the peak of what
    Python and NumPy allocate stays a small part of the array."""
    monkeypatch.setattr(importers, "CHUNK_TOKENS", 2048)
    rng = np.random.default_rng(11)
    tokens = 400_000
    first = rng.integers(0, EXPERTS, size=(tokens, LAYERS, 1))
    array = np.concatenate([first, (first + 1) % EXPERTS], axis=2).astype(np.int32)
    np.save(tmp_path / "big.npy", array)
    size = array.nbytes
    del array, first
    tracemalloc.start()
    try:
        convert.convert(
            tmp_path / "big.npy",
            tmp_path / "t.parquet",
            EXPERTS,
            group_rows=20_000,
            fmt="numpy",
            spill_rows=30_000,
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size / 3, (peak, size)
    assert tracefile.rows(tmp_path / "t.parquet") == tokens * LAYERS
