"""`moecache trace convert --from FORMAT`: each importer reads a small file written in its
tool's exact format into the trace that holds the same routing; malformed input is one
line, exit 2 and no file; files are read incrementally and long sequences spill to disk."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tracemalloc

import engine_writers
import numpy as np
import pytest

from moecache.errors import MoecacheError
from moecache.replay import convert, importers, moe_layers, tracefile

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


# -- the engines as they write (tests/engine_writers.py follows each one's own code) ----


def layered(seed: int, tokens: int, layers: int = LAYERS) -> np.ndarray:
    """[tokens, layers, k] distinct expert ids per token, most probable first."""
    rng = np.random.default_rng(seed)
    draws = [rng.choice(EXPERTS, K, replace=False) for _ in range(tokens * layers)]
    return np.array(draws).reshape(tokens, layers, K)


def trace_info(path) -> dict:
    return tracefile.header(path)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int32])
def test_vllm_as_served_base64_npy_with_the_prompt(tmp_path, dtype):
    """The server's base64 `.npy` (engine_writers.VLLM_PROTOCOL: vllm-project/vllm@002032ee
    vllm/entrypoints/openai/chat_completion/protocol.py) in every dtype it uses; the
    response-level prompt_routed_experts are the sequence's first rows: 5 prompt tokens and
    4 routed generated ones over 3 layers are 27 rows, not 12; --no-prompt leaves them out
    and says so."""
    prompt, generated = layered(20, 5), layered(21, 4)
    write_jsonl(tmp_path / "v.jsonl", [engine_writers.vllm_served("c", prompt, generated, dtype)])
    out = tmp_path / "t.parquet"
    done = convert.convert(tmp_path / "v.jsonl", out, EXPERTS, fmt="vllm")
    assert done["rows"] == 27 and done["prompt_tokens"] == 5
    whole = np.concatenate([prompt, generated])[None]
    assert same({(s, la): r for s, la, r in tracefile.streams(out)}, expected(whole, ["c/0"]))
    done = convert.convert(tmp_path / "v.jsonl", out, EXPERTS, fmt="vllm", prompt=False)
    assert done["rows"] == 12 and done["prompt_tokens_left_out"] == 5
    assert trace_info(out)["order"] == "router" and trace_info(out)["source"] == "vllm"


def test_vllm_dense_layers_named_or_from_config(tmp_path):
    """The capturer's buffer has a column per decoder layer and leaves a dense layer's all
    zero (engine_writers.VLLM_CAPTURER: vllm-project/vllm@00bd1493
    vllm/model_executor/layers/fused_moe/routed_experts_capturer.py): refused with a hint
    until the MoE layers are named (by --moe-layers or a DeepSeek config.json's
    first_k_dense_replace), then kept under their real numbers; an array of the MoE layers
    only maps onto them in order."""
    routing = layered(22, 6)
    full = engine_writers.vllm_capture(routing, 4, [1, 2, 3])
    response = engine_writers.vllm_served("d", None, full, np.int32)
    write_jsonl(tmp_path / "v.jsonl", [response])
    with pytest.raises(MoecacheError, match="layer 0 is all 0 .*--moe-layers"):
        converted(tmp_path / "v.jsonl", "vllm")
    want = {("d/0", layer): routing[:, layer - 1] for layer in (1, 2, 3)}
    assert same(converted(tmp_path / "v.jsonl", "vllm", layers=[1, 2, 3]), want)
    config = {"model_type": "deepseek_v2", "num_hidden_layers": 4, "first_k_dense_replace": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    layers = moe_layers.from_config(tmp_path)
    assert same(converted(tmp_path / "v.jsonl", "vllm", layers=layers), want)
    write_jsonl(tmp_path / "c.jsonl", [engine_writers.vllm_served("d", None, routing, np.int32)])
    assert same(converted(tmp_path / "c.jsonl", "vllm", layers=[1, 2, 3]), want)
    full[2, 3] = 0  # an all-zero row in a MoE layer is still refused
    write_jsonl(tmp_path / "z.jsonl", [engine_writers.vllm_served("d", None, full, np.int32)])
    with pytest.raises(MoecacheError, match="expert twice"):
        converted(tmp_path / "z.jsonl", "vllm", layers=[1, 2, 3])


def test_moe_layers_from_config_agree_with_the_adapters(tmp_path):
    """config.json read with plain json gives the family adapters' moe_layers."""
    from types import SimpleNamespace

    from moecache.model.registry import adapter_for

    configs = [
        {"model_type": "deepseek_v2", "num_hidden_layers": 27, "first_k_dense_replace": 1},
        {
            "model_type": "qwen3_moe",
            "num_hidden_layers": 12,
            "num_experts": 8,
            "mlp_only_layers": [0, 5],
            "decoder_sparse_step": 2,
        },
        {"model_type": "mixtral", "num_hidden_layers": 6},
    ]
    for config in configs:
        path = tmp_path / f"{config['model_type']}.json"
        path.write_text(json.dumps(config))
        namespace = SimpleNamespace(**{"mlp_only_layers": [], "decoder_sparse_step": 1, **config})
        want = adapter_for(config["model_type"]).moe_layers(namespace)
        assert moe_layers.from_config(path) == want, config
    assert moe_layers.parse("1-3,5") == [1, 2, 3, 5]


def test_sglang_per_token_dump(tmp_path):
    """SGLang's per_token recorder dump, torch.saved as its recorder saves it
    (engine_writers.SGLANG_RECORDER: sgl-project/sglang@02295fe5
    python/sglang/srt/eplb/expert_distribution.py): a dense layer's -1 column and the
    unused top-k slots dropped, the passes of a rank one sequence, real layer numbers."""
    pytest.importorskip("torch")
    routing = layered(23, 9)
    passes = [routing[:5], routing[5:6], routing[6:7], routing[7:9]]
    path = tmp_path / "expert_distribution_recorder_1.0_0.pt"
    engine_writers.sglang_dump(path, passes, 4, [1, 2, 3])
    want = {("rank0", layer): routing[:, layer - 1] for layer in (1, 2, 3)}
    assert same(converted(path, "sglang", experts=None), want)
    assert same(converted(path, "sglang", experts=None, layers=[1, 2, 3]), want)
    assert trace_info(tmp_path / "t.parquet")["order"] == "router"


def test_gzip_json_lines_and_zstd(tmp_path):
    """Logs kept gzip'd or zstd'd read as they are."""
    requests = routing(24)
    rows = [vllm_response(f"r{s}", requests[s]) for s in (0, 1)]
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (tmp_path / "v.jsonl.gz").write_bytes(gzip.compress(text))
    got = converted(tmp_path / "v.jsonl.gz", "vllm")
    assert same(got, expected(requests, ["r0/0", "r1/0"]))
    (tmp_path / "v.jsonl.zst").write_bytes(zstd(text))
    assert same(converted(tmp_path / "v.jsonl.zst", "vllm"), expected(requests, ["r0/0", "r1/0"]))


def zstd(data: bytes) -> bytes:
    """`data` zstd-compressed, as `zstd` writes a log (pyarrow's codec)."""
    import pyarrow as pa

    out = pa.BufferOutputStream()
    with pa.CompressedOutputStream(out, "zstd") as stream:
        stream.write(data)
    return out.getvalue().to_pybytes()


def test_policylang_parquet_and_scores_order(tmp_path):
    """moe-policylang's own save("x.parquet") (TraceRecording.save_parquet of 1.15.0) and
    save("x.jsonl") both import; recorded router scores order each token's experts."""
    recorder = pytest.importorskip("moe_policylang.integrations.trace_recorder")
    requests = routing(25)
    entries = [
        recorder.TraceEntry(p, t, layer, sorted(requests[p, t, layer].tolist()), [0.1, 0.9])
        for p in range(2)
        for layer in range(LAYERS)
        for t in range(TOKENS)
    ]
    recording = recorder.TraceRecording("m", LAYERS, EXPERTS, K, entries)
    want = {
        (str(p), layer): np.sort(requests[p, :, layer], axis=1)[:, ::-1]
        for p in range(2)
        for layer in range(LAYERS)
    }
    recording.save(tmp_path / "x.parquet")
    assert same(converted(tmp_path / "x.parquet", "policylang"), want)
    recording.save(tmp_path / "x.jsonl")
    assert same(converted(tmp_path / "x.jsonl", "policylang", experts=None), want)


def test_megatron_order_said_and_from_logits(tmp_path):
    """RouterTracer's rows come in expert-id order (engine_writers.MEGATRON_TRACER:
    NVIDIA/Megatron-LM@059f0f5c megatron/core/transformer/moe/router_trace.py,
    routing_map.nonzero): the trace's metadata says "expert-id"; with its logits sidecar
    (capture_logits) the logits restore the router's order; a step of no tokens is skipped."""
    requests = layered(26, 7)
    path = engine_writers.megatron_trace(tmp_path, requests, [4, 0, 3], EXPERTS, logits=False)
    got = converted(path, "megatron")
    assert same(got, {("rank0", la): np.sort(requests[:, la], axis=1) for la in range(LAYERS)})
    assert trace_info(tmp_path / "t.parquet")["order"] == "expert-id"
    path = engine_writers.megatron_trace(tmp_path, requests, [4, 0, 3], EXPERTS, logits=True)
    assert same(converted(path, "megatron"), expected(requests[None], ["rank0"]))
    assert trace_info(tmp_path / "t.parquet")["order"] == "router"


def bad_inputs(folder) -> list[tuple[str, list[str], str]]:
    """(name, extra CLI options, message) for each bad input of the trace format's list,
    its file written into `folder`."""
    good = layered(27, 4)
    served = engine_writers.vllm_served("a", None, good, np.int32)
    text = json.dumps(served) + "\n"

    def save(name, data):
        (folder / name).write_bytes(data if isinstance(data, bytes) else data.encode())

    np.save(folder / "whole.npy", good)
    whole = (folder / "whole.npy").read_bytes()
    save("truncated.npy", whole[:-5])
    np.savez(folder / "whole.npz", a=good)
    save("truncated.npz", (folder / "whole.npz").read_bytes()[:-30])
    save("truncated.jsonl.gz", gzip.compress(text.encode())[:-12])
    save("empty.jsonl", "")
    ragged = json.loads(text)
    ragged["choices"][0]["routed_experts"] = good.tolist()
    ragged["choices"][0]["routed_experts"][1][0] = [1, 2, 3]
    save("ragged.jsonl", json.dumps(ragged))
    save("range.jsonl", json.dumps(engine_writers.vllm_served("a", None, good + 8, np.int32)))
    np.save(folder / "dtype.npy", good.astype(np.float32))
    twice = good.copy()
    twice[2, 1] = [3, 3]
    save("twice.jsonl", json.dumps(engine_writers.vllm_served("a", None, twice, np.int32)))
    save("latin1.jsonl", text.replace('"m"', '"\xe9"').encode("latin-1"))
    save("truncated.jsonl.zst", zstd(text.encode())[:-12])
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), folder / "other.parquet")
    vllm = ["--from", "vllm"]
    return [
        ("truncated.npy", ["--from", "numpy"], "truncated at token"),
        ("truncated.npz", ["--from", "numpy"], "truncated or damaged .npz"),
        ("truncated.jsonl.gz", vllm, "truncated or damaged"),
        ("empty.jsonl", vllm, "no rows"),
        ("ragged.jsonl", vllm, "ragged"),
        ("range.jsonl", vllm, "outside 0..7"),
        ("dtype.npy", ["--from", "numpy"], "must be integers, not float32"),
        ("twice.jsonl", vllm, "routes to an expert twice"),
        ("latin1.jsonl", vllm, "not UTF-8"),
        ("truncated.jsonl.zst", vllm, "truncated or damaged"),
        ("other.parquet", vllm, "a Parquet file"),
        ("whole.npz", vllm, "a zip archive"),
        ("whole.npy", ["--from", "moecache"], "a NumPy .npy array"),
    ]


BAD = (
    "truncated.npy",
    "truncated.npz",
    "truncated.jsonl.gz",
    "empty.jsonl",
    "ragged.jsonl",
    "range.jsonl",
    "dtype.npy",
    "twice.jsonl",
    "latin1.jsonl",
    "truncated.jsonl.zst",
    "other.parquet",
    "whole.npz",
    "whole.npy",
)


def test_the_bad_inputs_are_all_tried(tmp_path):
    assert [case[0] for case in bad_inputs(tmp_path)] == list(BAD)


@pytest.mark.parametrize("name", BAD)
def test_every_bad_input_is_one_line_exit_2_and_nothing_left(tmp_path, name):
    """Each bad input, through the command line: one line, exit status 2, and nothing left
    in the output's folder."""
    cases = {case[0]: case for case in bad_inputs(tmp_path)}
    _, options, message = cases[name]
    out = tmp_path / "out"
    out.mkdir()
    command = [sys.executable, "-m", "moecache", "trace", "convert", str(tmp_path / name)]
    done = subprocess.run(
        [*command, *options, "--experts", str(EXPERTS), "--out", str(out / "t.parquet")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert not list(out.iterdir())


def test_cli_names_moe_layers_and_says_prompt_and_order(tmp_path):
    """--model-config through the command line; the summary says the prompt rows and the
    order; a stat-mode SGLang dump is one line naming per_token mode."""
    routing = layered(28, 4)
    full = engine_writers.vllm_capture(routing, 4, [1, 2, 3])
    served = engine_writers.vllm_served("e", full[:2], full[2:], np.uint8)
    write_jsonl(tmp_path / "v.jsonl", [served])
    config = {"num_hidden_layers": 4, "first_k_dense_replace": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    command = [sys.executable, "-m", "moecache", "trace", "convert", str(tmp_path / "v.jsonl")]
    options = ["--from", "vllm", "--experts", "8", "--model-config", str(tmp_path)]
    done = subprocess.run(
        [*command, *options, "--out", str(tmp_path / "t.parquet")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "12 rows" in done.stdout and "2 prompt tokens, first in their sequences" in done.stdout
    assert "experts in router order" in done.stdout
    torch = pytest.importorskip("torch")
    torch.save({"rank": 0, "logical_count": torch.zeros(2, 8)}, str(tmp_path / "stat.pt"))
    with pytest.raises(MoecacheError, match="per_token"):
        converted(tmp_path / "stat.pt", "sglang")
