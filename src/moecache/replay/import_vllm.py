"""vLLM's routed experts, one response a line (JSON lines, plain or compressed), as its
OpenAI-compatible server returns them with `--enable-return-routed-experts`, or as a
script writes the offline API's `RequestOutput`s:

- a choice's `routed_experts` is a base64-encoded `.npy` of shape (tokens - 1, layers, k)
  in uint8, uint16 or int32 (vllm/entrypoints/openai/chat_completion/protocol.py,
  `ChatCompletionResponseChoice.routed_experts`: the last sampled token is never
  forwarded, so it has no routing), or nested lists [tokens][layers][k] (older servers,
  and `CompletionOutput.routed_experts` of vllm/outputs.py written with `.tolist()`);
- the prompt's routing, where vLLM splits it off (`split_routed_experts` of
  vllm/model_executor/layers/fused_moe/routed_experts_capturer.py), is the response's
  `prompt_routed_experts` (`RequestOutput.prompt_routed_experts` offline), in either form.

One sequence `id/index` per choice: the prompt's rows first, then the choice's, unless
the prompt is left out (`--no-prompt`), which the summary then says.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Iterator

import numpy as np

from moecache.errors import MoecacheError
from moecache.replay import containers, moe_layers

HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def npy_header(where: str, stream) -> tuple[tuple, np.dtype]:
    """An .npy header (shape, dtype) of an integer array in C order; nothing unpickled."""
    try:
        version = np.lib.format.read_magic(stream)
        read_header = HEADER_READERS.get(version)
        if read_header is None:
            raise ValueError(f"format version {version}, not 1.0 or 2.0")
        shape, fortran, dtype = read_header(stream)
    except ValueError as error:
        raise MoecacheError(f"{where}: not a NumPy array ({error})") from None
    if dtype.kind not in "iu" or dtype.hasobject:
        raise MoecacheError(f"{where}: expert ids must be integers, not {dtype}")
    if fortran:
        raise MoecacheError(f"{where}: a Fortran-ordered array (save it in C order)")
    return shape, dtype


def decoded(where: str, text: str, what: str) -> np.ndarray:
    """vLLM's base64 `.npy` string as an int64 array [tokens, layers, k]."""
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise MoecacheError(f"{where}: {what} is a string but not base64") from None
    stream = io.BytesIO(data)
    shape, dtype = npy_header(f"{where}: {what}", stream)
    body = stream.read()
    size = int(np.prod(shape)) * dtype.itemsize
    if len(body) < size:
        raise MoecacheError(f"{where}: {what} truncated ({len(body)} of {size} bytes)")
    return np.frombuffer(body[:size], dtype=dtype).reshape(shape).astype(np.int64)


def ints(where: str, value, what: str) -> np.ndarray:
    """A nested list of ints, or vLLM's base64 `.npy` string, as an int64 array."""
    if isinstance(value, str):
        return decoded(where, value, what)
    try:
        array = np.array(value)
    except ValueError:
        raise MoecacheError(f"{where}: {what} is ragged") from None
    if array.size and array.dtype.kind not in "iu":
        raise MoecacheError(f"{where}: {what} must hold only ints (or be vLLM's base64 .npy)")
    return array.astype(np.int64)


def routing(where: str, value, what: str, empty: bool = False) -> np.ndarray:
    """[tokens, layers, k]; no tokens only where `empty` (one generated token, after a
    prompt: the last token has no routing)."""
    experts = ints(where, value, what)
    if experts.ndim != 3 or not (experts.size or empty and experts.shape[1:].count(0) == 0):
        raise MoecacheError(
            f"{where}: {what} must be [tokens][layers][k], not of shape {list(experts.shape)}"
        )
    return experts


def sequences(where: str, row: dict, prompt: bool, record: dict) -> Iterator[tuple]:
    """(name, routing [tokens, layers, k]) per choice of one response."""
    request = row.get("id", row.get("request_id"))
    choices = row.get("choices", row.get("outputs"))
    if request is None or not isinstance(choices, list):
        raise MoecacheError(
            f"{where}: not a vLLM response (needs id and choices, or request_id and outputs)"
        )
    head = row.get("prompt_routed_experts")
    if head is not None:
        head = routing(where, head, "prompt_routed_experts")
        record["prompt_tokens" if prompt else "prompt_tokens_left_out"] += head.shape[0]
    for choice in choices:
        routed = choice.get("routed_experts") if isinstance(choice, dict) else None
        if routed is None:
            raise MoecacheError(
                f"{where}: a choice without routed_experts (serve with "
                "--enable-return-routed-experts; null too for a request aborted before its "
                "first forward pass)"
            )
        experts = routing(where, routed, "routed_experts", head is not None and prompt)
        if head is not None and prompt:
            if head.shape[1:] != experts.shape[1:]:
                raise MoecacheError(
                    f"{where}: prompt_routed_experts [tokens, {head.shape[1]}, "
                    f"{head.shape[2]}] and routed_experts [tokens, {experts.shape[1]}, "
                    f"{experts.shape[2]}] disagree"
                )
            experts = np.concatenate([head, experts])
        yield f"{request}/{choice.get('index', 0)}", experts


def vllm_rows(path, layers: list[int] | None, prompt: bool, record: dict) -> Iterator[tuple]:
    """Blocks (where, sequence, layer, rows, token) of a file of vLLM responses."""
    record.update(order="router", prompt_tokens=0, prompt_tokens_left_out=0)
    for where, row in containers.json_lines(path):
        for name, experts in sequences(where, row, prompt, record):
            for column, layer in moe_layers.columns(where, experts.shape[1], layers):
                rows = experts[:, column]
                moe_layers.refuse_dense(where, rows, layer, 0)
                yield where, name, layer, rows, 0
