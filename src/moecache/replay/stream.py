"""Replay a trace larger than memory: a moecache-trace file read one row group at a time,
its streams gathered into batches of about `tokens` tokens, each batch replayed under
every rule before the next is read (engine.report_parts). Memory is bounded by the
batch, not the trace: about 40 bytes per token and expert requested, padded to the
batch's longest stream.
"""

from __future__ import annotations

from collections.abc import Iterator

from tqdm import tqdm

from moecache.records.demand import Demand, check, padded
from moecache.replay import engine, tracefile

BATCH_TOKENS = 1 << 19  # tokens (over all layers) held at once


def batches(path, tokens: int = BATCH_TOKENS) -> Iterator[Demand]:
    """The trace's streams in order, as Demands of whole streams, about `tokens` each."""
    info = tracefile.header(path)
    held, size = [], 0
    for sequence, layer, requests in tracefile.streams(path):
        held.append((sequence, layer, requests))
        size += len(requests)
        if size >= tokens:
            yield batch(held, info, path)
            held, size = [], 0
    if held:
        yield batch(held, info, path)


def batch(held: list, info: dict, path) -> Demand:
    requests, lengths = padded([r for _, _, r in held], info["top_k"])
    names = [f"layer{layer}/{sequence}" for sequence, layer, _ in held]
    demand = Demand(names, [s for s, _, _ in held], requests, lengths, info["experts"])
    check(demand, str(path))
    return demand


def report(
    path,
    capacity: int,
    rules: list[str] | None = None,
    tokens: int = BATCH_TOKENS,
    per_request: bool = False,
):
    """engine.report of the whole trace, with a progress bar over its tokens (stderr);
    with `per_request`, counted one request at a time (moecache.replay.flat)."""
    from moecache.replay import flat

    total = tracefile.rows(path)
    replay = flat.replayed if per_request else engine.replayed
    with tqdm(total=total, unit="tok", desc="replay", mininterval=2) as bar:
        out = engine.report_parts(
            batches(path, tokens),
            capacity,
            rules,
            lambda d: bar.update(int(d.lengths.sum())),
            replay=replay,
        )
    return {**out, "counting": "per-request"} if per_request else out


def foresight(path, capacity: int, ks: list[int], heldout_last: int, tokens: int = BATCH_TOKENS):
    """foresight.curve of the whole trace, a batch at a time, with a progress bar."""
    from moecache.replay import foresight

    with tqdm(total=tracefile.rows(path), unit="tok", desc="foresight", mininterval=2) as bar:

        def parts():
            for demand in batches(path, tokens):
                yield demand
                bar.update(int(demand.lengths.sum()))

        return foresight.curve_parts(parts(), capacity, ks, heldout_last)


def bounds(path, capacity: int, mixed: dict | None = None, tokens: int = BATCH_TOKENS) -> dict:
    """bound.report of the whole trace, a batch at a time, with a progress bar."""
    from moecache.replay import bound

    with tqdm(total=tracefile.rows(path), unit="tok", desc="bound", mininterval=2) as bar:
        return bound.report_parts(counted(batches(path, tokens), bar), capacity, mixed)


def counted(parts, bar):
    """The parts, each counted on the bar once it has been used."""
    for demand in parts:
        yield demand
        bar.update(int(demand.lengths.sum()))
