"""Batch geometry: where each sequence of a batch sits, and the union demand of a step.

Both the batched replay (replay/batch.py) and the batched harness (harness/batched.py,
continuous.py, union_block.py) build batches with these, so the two serve the same unions
(docs/batching.md). Pure numpy.
"""

from __future__ import annotations

import heapq

import numpy as np

from moecache.records.demand import PAD, Demand

MODES = ("static", "continuous")


def layer_of(stream: str) -> str:
    """A trace stream is "layer<L>/<sequence>"; other ids are their own layer."""
    return stream.split("/")[0]


def layer_number(stream: str) -> int | None:
    """L of a stream "layer<L>/<sequence>" (None for other ids)."""
    head = layer_of(stream)
    return int(head[5:]) if head.startswith("layer") and head[5:].isdigit() else None


def places(lengths: list[int], size: int, batching: str) -> list[tuple[int, int, int]]:
    """(batch, slot, first step) of each sequence, in trace order."""
    if batching == "static":
        return [(i // size, i % size, 0) for i in range(len(lengths))]
    free = [(0, slot) for slot in range(size)]  # (step the slot frees, slot)
    out = []
    for n in lengths:
        at, slot = heapq.heappop(free)  # the earliest free place, the lower slot on ties
        out.append((0, slot, at))
        heapq.heappush(free, (at + n, slot))
    return out


def collapse(tokens: np.ndarray, prefill: int) -> np.ndarray:
    """One sequence's demand [n, k] as [n - P + 1, P * k]: step 0 the union of its first P
    tokens (token after token, each in its router's order, a repeat left out), then its
    tokens one a step."""
    k = tokens.shape[1]
    out = np.full((len(tokens) - prefill + 1, prefill * k), PAD, dtype=np.int64)
    prompt = [e for e in dict.fromkeys(tokens[:prefill].ravel().tolist()) if e != PAD]
    out[0, : len(prompt)] = prompt
    out[1:, :k] = tokens[prefill:]
    return out


def union(demand: Demand, group: list[tuple[int, int, int]], size: int) -> np.ndarray:
    """[steps, size * k]: at each step the experts of the group's streams (stream, slot,
    first step), slot after slot, each in its router's order, a repeat replaced by PAD and
    every PAD moved to the end."""
    k = demand.top_k
    steps = max(at + int(demand.lengths[s]) for s, _, at in group)
    row = np.full((steps, size * k), PAD, dtype=np.int64)
    for s, slot, at in group:
        n = int(demand.lengths[s])
        row[at : at + n, slot * k : (slot + 1) * k] = demand.requests[s, :n]
    ordered = np.argsort(row, axis=1, kind="stable")  # equal ids adjacent, first one first
    ids = np.take_along_axis(row, ordered, axis=1)
    repeat = np.zeros_like(row, dtype=bool)
    np.put_along_axis(repeat, ordered[:, 1:], ids[:, 1:] == ids[:, :-1], axis=1)
    row[repeat] = PAD
    return np.take_along_axis(row, np.argsort(row == PAD, axis=1, kind="stable"), axis=1)


def stack(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Requests [streams, T, W], W the widest union, and lengths."""
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    width = max((int((r != PAD).sum(axis=1).max(initial=0)) for r in rows), default=0)
    requests = np.full((len(rows), lengths.max(initial=0), width), PAD, dtype=np.int64)
    for s, row in enumerate(rows):
        requests[s, : len(row)] = row[:, :width]
    return requests, lengths


def rounds(wanted: np.ndarray, resident: np.ndarray, capacity: int) -> list[np.ndarray]:
    """One step's requests: the union `wanted` as one request when it fits; else its
    resident experts first, then the rest, each in ascending id, `capacity` at a time."""
    if len(wanted) <= capacity:
        return [wanted]
    wanted = np.sort(wanted)
    held = resident[wanted]
    order = np.concatenate([wanted[held], wanted[~held]])
    return [order[i : i + capacity] for i in range(0, len(order), capacity)]


def future(requests: np.ndarray) -> np.ndarray:
    """[1, T, W] demand for a rule that reads ahead, each union padded with its own first
    expert (a repeat changes no next use, where PAD would stand for expert 0)."""
    return np.where(requests == PAD, requests[:, :1], requests)[None]
