"""The independent NLL check: each whole sequence in one forward pass (no pool, no token by
token), its summed next-token NLL, against which the gates hold the teacher-forced decode
(decode.py) and a run's Delta NLL is taken."""

from __future__ import annotations

import torch

from moecache.model import memory
from moecache.model.memory import DEVICE, LEDGER


def next_token_nll_sum(logits: torch.Tensor, x: torch.Tensor) -> float:
    """Summed next-token NLL of one sequence `x` [1, T] from its logits [1, T, V]: the
    float32 scores and their log-probabilities counted by the accountant while alive (what
    cross_entropy computes, in the same kernels, so the same value to the bit)."""
    scores = logits[0, :-1].float()
    if scores.untyped_storage().data_ptr() != logits.untyped_storage().data_ptr():
        LEDGER.adopt("nll check", DEVICE, scores)  # a copy, unless the logits are float32
    log_probs = LEDGER.adopt("nll check", DEVICE, torch.log_softmax(scores, -1))
    return torch.nn.functional.nll_loss(log_probs, x[0, 1:], reduction="sum").item()


@torch.inference_mode()
def batched_nll_sums(model, sequences, device) -> list[float]:
    """The independent check: each whole sequence in one forward pass, its summed NLL; its
    logits and KV cache counted by the accountant while alive."""
    sums = []
    for ids in sequences:
        x = torch.tensor([ids], device=device)
        out = model(input_ids=x)
        LEDGER.adopt("nll check", DEVICE, out.logits)
        memory.count_cache(out.past_key_values)
        sums.append(next_token_nll_sum(out.logits, x))
        del out
    return sums


def batched_nll(model, sequences, device) -> float:
    return sum(batched_nll_sums(model, sequences, device)) / sum(len(s) - 1 for s in sequences)
