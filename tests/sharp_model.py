"""A tiny random OLMoE whose NLL shows a wrong expert, and random sequences of given
lengths: what the batched and overlapped harness tests decode."""

from __future__ import annotations

import torch
from test_families import ARCH  # the same tiny architecture as the families' gates

from moecache.model import tiny
from moecache.model.kernel import PER_EXPERT


def sharp_model(per_expert: bool = False):
    """`per_expert`: the experts one by one (the kernel an overlapped block can wait in)."""
    built = tiny.model("olmoe", ARCH, vocab_size=300, seed=0)
    if per_expert:
        built.config._experts_implementation = PER_EXPERT
    with torch.no_grad():
        built.lm_head.weight.mul_(20)  # sharp: a wrong expert shows in the NLL
    return built


def random_sequences(lengths: list[int]) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, 290, (n,), generator=generator).tolist() for n in lengths]
