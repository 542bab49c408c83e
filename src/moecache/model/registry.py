"""The families that have an adapter, by transformers' model_type. Adding a family is one
adapter file in this folder and one line here (docs/adding-a-model.md)."""

from __future__ import annotations

import functools

from moecache.errors import MoecacheError
from moecache.model.adapter import MoeAdapter
from moecache.model.deepseek_v2 import DeepseekV2Adapter
from moecache.model.deepseek_v3 import DeepseekV3Adapter
from moecache.model.gpt_oss import GptOssAdapter
from moecache.model.mixtral import MixtralAdapter
from moecache.model.olmoe import OlmoeAdapter
from moecache.model.qwen2_moe import Qwen2MoeAdapter
from moecache.model.qwen3_moe import Qwen3MoeAdapter

ADAPTERS: dict[str, type[MoeAdapter]] = {
    "olmoe": OlmoeAdapter,
    "mixtral": MixtralAdapter,
    "qwen2_moe": Qwen2MoeAdapter,
    "qwen3_moe": Qwen3MoeAdapter,
    "deepseek_v2": DeepseekV2Adapter,
    "deepseek_v3": DeepseekV3Adapter,
    "gpt_oss": GptOssAdapter,
}


@functools.cache
def adapter_for(model_type: str) -> MoeAdapter:
    """The adapter of a checkpoint's model_type (one instance each: adapters hold no state,
    and the decode asks per token); one line naming those that exist if none."""
    if model_type not in ADAPTERS:
        raise MoecacheError(
            f"model_type {model_type!r} has no adapter; families with one: "
            + ", ".join(sorted(ADAPTERS))
        )
    return ADAPTERS[model_type]()


def of(model) -> MoeAdapter:
    """The adapter of a loaded model."""
    return adapter_for(model.config.model_type)
