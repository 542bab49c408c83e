"""Per-request counting (`moecache replay --per-request`): each token's k experts become k
consecutive single requests, in the router's order, as one-request-at-a-time cache
simulators (libCacheSim, bigrig, moe-policylang) count them.

It is not what decoding obeys: a token's k experts are computed together, so all k must be
resident at once and none may be evicted for another (per-token counting, the engine's).
One request at a time lets a token's later expert evict its earlier one, which LRU then
reloads less often by luck and Belady's MIN plans around: its count falls below the fewest
copies any lossless schedule can make (docs/replay.md, "Per token or per request").
"""

from __future__ import annotations

from moecache.records.demand import Demand
from moecache.replay import engine, plain


def flattened(demand: Demand) -> Demand:
    """Every stream's tokens [T, k] as T * k tokens of one request each (padding stays at
    the end of each stream, so a reshape keeps the order)."""
    streams, steps, k = demand.requests.shape
    return Demand(
        demand.streams,
        demand.sequences,
        demand.requests.reshape(streams, steps * k, 1),
        demand.lengths * k,
        demand.num_experts,
        None,  # router probabilities are per token, not per request
        demand.origin,
    )


def replayed(demand: Demand, text: str, capacity: int) -> engine.Counts:
    """engine.replayed on the flattened demand: a replay for engine.report_parts."""
    return engine.replayed(flattened(demand), text, capacity)


def replayed_once(demand: Demand, text: str, capacity: int) -> engine.Counts:
    """replayed, for a command that replays once: LRU and MIN over a small demand run in
    plain Python (moecache.replay.plain), done before numba would have loaded; the same
    counts. Timings of the compiled replay (moecache.replay.peers) use `replayed`."""
    flat = flattened(demand)
    if plain.fits(flat, text):
        flat.check_capacity(capacity)
        return engine.tally(*plain.replay(text, flat, capacity), capacity, flat)
    return engine.replayed(flat, text, capacity)


def report(demand: Demand, capacity: int, rules: list[str] | None = None) -> dict:
    """engine.report counted one request at a time; copies per token still divide by the
    decoding tokens (each sequence's after its first)."""
    rules = rules or engine.lossless_rules(flattened(demand))
    out = engine.report_parts([demand], capacity, rules, replay=replayed_once)
    return {**out, "counting": "per-request"}
