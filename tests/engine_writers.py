"""Routing logs written the way each engine's own code writes them, for the importer tests:
each function follows the named upstream file at the named commit, not docs/trace-format.md.
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np

VLLM_PROTOCOL = (
    "vllm-project/vllm@002032ee2b18e1f7bd924ec47b62504ba3866063 "
    "vllm/entrypoints/openai/chat_completion/protocol.py"
)
VLLM_CAPTURER = (
    "vllm-project/vllm@00bd1493b3e82d6c13c68ee8a0e1c5a96707e190 "
    "vllm/model_executor/layers/fused_moe/routed_experts_capturer.py"
)
SGLANG_RECORDER = (
    "sgl-project/sglang@02295fe5ac5ccff3e8829800d50450351c56fb53 "
    "python/sglang/srt/eplb/expert_distribution.py"
)
MEGATRON_TRACER = (
    "NVIDIA/Megatron-LM@059f0f5c78cddcfa10e34842607d68b745631aeb "
    "megatron/core/transformer/moe/router_trace.py"
)


def vllm_npy(array: np.ndarray) -> str:
    """`ChatCompletionResponseChoice.routed_experts` (VLLM_PROTOCOL): base64 of the `.npy`
    bytes, which the protocol says `np.load(io.BytesIO(base64.b64decode(s)))` decodes."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode()


def vllm_capture(routing: np.ndarray, num_hidden_layers: int, moe: list[int]) -> np.ndarray:
    """The capturer's buffer for one request (VLLM_CAPTURER): int32 zeros of
    [tokens, num_hidden_layers, k], into which `capture(layer_id, topk_ids)` writes only the
    MoE layers; a dense layer's rows stay all zero."""
    tokens, _, k = routing.shape
    buffer = np.zeros((tokens, num_hidden_layers, k), dtype=np.int32)
    for column, layer in enumerate(moe):
        buffer[:, layer, :] = routing[:, column, :]
    return buffer


def vllm_served(name: str, prompt: np.ndarray | None, generated: np.ndarray, dtype) -> dict:
    """A chat completion as the server returns it (VLLM_PROTOCOL): the choice's
    `routed_experts` [tokens - 1, layers, k] and the response's `prompt_routed_experts`,
    both base64 `.npy` in `dtype` (uint8, uint16 or int32)."""
    response = {
        "id": name,
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "..."},
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": None,
                "routed_experts": vllm_npy(generated.astype(dtype)),
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": len(generated) + 1},
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_routed_experts": None if prompt is None else vllm_npy(prompt.astype(dtype)),
        "kv_transfer_params": None,
    }
    return response


def sglang_dump(path, passes: list[np.ndarray], num_layers: int, moe: list[int], rank=0):
    """An `expert_distribution_recorder_{time}_{rank}.pt` of `per_token` mode
    (SGLANG_RECORDER): per forward pass, `_DetailSinglePassGatherer` fills an int32 buffer
    [num_layers, tokens, 8] with -1 on reset, `on_select_experts` writes [:n, :k] of the MoE
    layers, `collect` keeps [:, :num_tokens, :]; `_DetailAccumulator` appends the pass's
    record and `dump` torch.saves {"records", "last_physical_to_logical_map"}. Each array of
    `passes` is [tokens, len(moe), k]."""
    import torch

    num_experts = 1 + max(int(p.max()) for p in passes)
    records = []
    for forward_pass_id, routing in enumerate(passes):
        tokens, _, k = routing.shape
        buffer = torch.full((num_layers, tokens * 2, 8), -1, dtype=torch.int32)
        for column, layer in enumerate(moe):
            topk_ids = torch.from_numpy(routing[:, column].astype(np.int32))
            buffer[layer, : topk_ids.shape[0], : topk_ids.shape[1]] = topk_ids
        records.append(
            dict(
                forward_pass_id=forward_pass_id,
                rank=rank,
                gatherer_key="primary",
                input_ids=list(range(tokens)),
                positions=list(range(tokens)),
                extend_seq_lens=[tokens] if forward_pass_id == 0 else None,
                forward_mode=1 if forward_pass_id == 0 else 2,
                topk_ids_of_layer=buffer[:, :tokens, :].clone().cpu(),
                misc_objects=[],
                global_physical_count=torch.zeros((num_layers, num_experts), dtype=torch.int32),
            )
        )
    mapping = torch.arange(num_experts).repeat(num_layers, 1)
    torch.save(dict(records=records, last_physical_to_logical_map=mapping), str(path))


def bf16_bytes(values: np.ndarray) -> bytes:
    """float32 as bfloat16 bytes (the top halves), as the tracer's `.view(torch.int16)`."""
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()


def megatron_trace(folder, routing: np.ndarray, per_step, num_experts: int, logits: bool):
    """router_trace_rank0.jsonl as RouterTracer writes it (MEGATRON_TRACER): per step every
    decoder layer's record, its top_indices from `routing_map.nonzero()` (each token's experts
    in ascending id); with `capture_logits`, the bfloat16 pre-top-k logits appended to
    logits_rank0.bin and the record's logit_offset, logit_bytes and logit_shape. `routing`
    [tokens, layers, k] is in router order (most probable first); the logits are drawn to
    agree with it."""
    rng = np.random.default_rng(0)
    tokens, layers, k = routing.shape
    lines, sidecar, start = [], bytearray(), 0
    for step, count in enumerate(per_step):
        for layer in range(layers):
            chosen = routing[start : start + count, layer]
            record = {
                "step": step,
                "stage": "pre_dispatch",
                "block": "decoder",
                "layer": layer,
                "rank": 0,
                "num_tokens": count,
                "topk": k,
                "top_indices": np.sort(chosen, axis=1).tolist(),
            }
            if logits:
                values = rng.uniform(-4, -1, size=(count, num_experts))
                for i, row in enumerate(chosen):
                    values[i, row] = np.arange(k, 0, -1, dtype=float)  # most probable first
                data = bf16_bytes(values)
                record.update(logit_offset=len(sidecar), logit_bytes=len(data))
                record["logit_shape"] = [count, num_experts]
                sidecar += data
            lines.append(json.dumps(record))
        start += count
    (folder / "router_trace_rank0.jsonl").write_text("\n".join(lines) + "\n")
    if logits:
        (folder / "logits_rank0.bin").write_bytes(bytes(sidecar))
    return folder / "router_trace_rank0.jsonl"
