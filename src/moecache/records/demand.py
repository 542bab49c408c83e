"""The demand of a trace: what each token of each stream requests (replay replays it, the
harness builds its batches' futures from it, the learned stage labels it).

A stream is one restricted layer over one sequence (its own pool). Two sources: the
harness's Parquet traces (one stream per layer and sequence, with router probabilities)
and JSON-lines files, one stream a line: {"stream": "<id>", "tokens": [[e, ...], ...]}.
Streams are held padded in one array so replay can step through all of them at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from moecache.errors import MoecacheError
from moecache.records.shape import check_shape

PAD = -1  # requests[s, t] past the end of stream s


@dataclass
class Demand:
    streams: list[str]  # one id per stream
    sequences: list[str]  # the sequence each stream decodes (layers of one sequence share it)
    requests: np.ndarray  # [streams, T, k] expert ids, PAD after each stream's end
    lengths: np.ndarray  # [streams] tokens per stream
    num_experts: int
    probs: np.ndarray | None = None  # [streams, T, N] router probabilities, when recorded
    origin: dict = field(default_factory=dict)  # run, config hash and device of a trace

    @property
    def top_k(self) -> int:
        return self.requests.shape[2]

    @property
    def timed_tokens(self) -> int:
        """Tokens per sequence after its first, summed over sequences (the harness's rho
        divides by these: copies of all layers count against one token)."""
        first = dict(zip(self.sequences, self.lengths.tolist(), strict=True))
        return sum(n - 1 for n in first.values())

    @cached_property
    def distinct(self) -> np.ndarray:
        """Experts each stream requests at least once."""
        seen = np.zeros((len(self.streams), self.num_experts + 1), dtype=bool)
        rows = np.arange(len(self.streams))[:, None, None]
        seen[rows, np.where(self.requests == PAD, self.num_experts, self.requests)] = True
        return seen[:, :-1].sum(axis=1)

    def check_capacity(self, capacity: int) -> None:
        """A token's experts fit the pool, which holds no more than there are (top_k 0: a
        demand of no requests, only the capacity's range)."""
        top_k = self.top_k or None
        check_shape(top_k, capacity, self.num_experts, where=f"--capacity {capacity}")


def subset(demand: Demand, streams) -> Demand:
    """The streams at indices `streams` of `demand`, in that order."""
    picked = np.asarray(streams, dtype=np.int64)
    steps = int(demand.lengths[picked].max(initial=0))
    return Demand(
        [demand.streams[s] for s in picked],
        [demand.sequences[s] for s in picked],
        demand.requests[picked, :steps],
        demand.lengths[picked],
        demand.num_experts,
        None if demand.probs is None else demand.probs[picked, :steps],
        demand.origin,
    )


def padded(tokens: list[np.ndarray], top_k: int) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([len(t) for t in tokens], dtype=np.int64)
    requests = np.full((len(tokens), lengths.max(initial=0), top_k), PAD, dtype=np.int64)
    for s, stream in enumerate(tokens):
        requests[s, : len(stream)] = stream
    return requests, lengths


def from_arrays(requests: np.ndarray, num_experts: int, prefix: str = "instance") -> Demand:
    """Equal-length streams [streams, T, k], e.g. generated ones."""
    requests = np.asarray(requests, dtype=np.int64)
    names = [f"{prefix}-{i}" for i in range(len(requests))]
    lengths = np.full(len(requests), requests.shape[1], dtype=np.int64)
    return Demand(names, names, requests, lengths, num_experts)


def json_lines(path, what: str):
    """(where, object) per non-blank line of a JSON-lines file; `where` is path:line."""
    if not Path(path).is_file():
        raise MoecacheError(f"{path}: no such {what}")
    with open(path) as lines:
        yield from json_objects(path, enumerate(lines, start=1))


def json_objects(path, numbered):
    """(where, object) per non-blank (number, text) line of `path`; anything but a JSON
    object is one line naming its place."""
    for number, line in numbered:
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise MoecacheError(f"{where}: not JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise MoecacheError(f"{where}: not a JSON object")
        yield where, row


def read_jsonl(path, num_experts: int) -> Demand:
    """One stream a line: {"stream": "<id>", "tokens": [[e, ...], ...]}; every token
    requests the same number of distinct experts."""
    streams, tokens = [], []
    for where, row in json_lines(path, "demand file"):
        if set(row) != {"stream", "tokens"}:
            raise MoecacheError(f'{where}: need exactly the keys "stream" and "tokens"')
        name, stream = str(row["stream"]), row["tokens"]
        if name in streams:
            raise MoecacheError(f"{where}: stream {name!r} appears twice")
        ok = isinstance(stream, list) and stream and all(isinstance(t, list) for t in stream)
        if not ok or not all(type(e) is int for t in stream for e in t):
            raise MoecacheError(f"{where}: tokens must be a non-empty list of lists of ints")
        width = {len(t) for t in stream} | ({tokens[0].shape[1]} if tokens else set())
        if len(width) > 1:
            raise MoecacheError(
                f"{where}: ragged demand, tokens request {sorted(width)} experts "
                "(every token must request the same number)"
            )
        streams.append(name)
        tokens.append(np.array(stream, dtype=np.int64))
    if not streams:
        raise MoecacheError(f"{path}: no streams")
    if tokens[0].shape[1] == 0:
        raise MoecacheError(f"{path}: tokens request no experts")
    requests, lengths = padded(tokens, tokens[0].shape[1])
    demand = Demand(streams, list(streams), requests, lengths, num_experts)
    check(demand, str(path))
    return demand


def check(demand: Demand, source: str) -> None:
    """Expert ids in range and distinct within each token."""
    real = np.arange(demand.requests.shape[1]) < demand.lengths[:, None]  # [streams, T]
    bad = real[..., None] & ((demand.requests < 0) | (demand.requests >= demand.num_experts))
    if bad.any():
        s, t, j = np.argwhere(bad)[0]
        raise MoecacheError(
            f"{source}: stream {demand.streams[s]} token {t} requests expert "
            f"{demand.requests[s, t, j]}, outside 0..{demand.num_experts - 1}"
        )
    ordered = np.sort(demand.requests, axis=2)
    repeated = (ordered[..., 1:] == ordered[..., :-1]).any(axis=2) & real
    if repeated.any():
        s, t = np.argwhere(repeated)[0]
        raise MoecacheError(
            f"{source}: stream {demand.streams[s]} token {t} requests an expert twice"
        )
