"""Bounds on the fewest copies of any lossless schedule (the paper's appendix on optimality).

B_flat <= B* <= B_greedy: B_greedy is farthest-future eviction (per-token semantics, fetch
on demand); B_flat is the classical MIN optimum of the stream flattened into single
requests, a token's experts one after another. Any lossless schedule serves the flattened
stream, in any within-token order, at the same cost, so every order gives a lower bound;
we try several per stream and keep the tightest (the largest). All counts are the paper's
steady traffic B: insertions beyond the first min(C, distinct) every schedule makes.
"""

from __future__ import annotations

import statistics

import numpy as np

from moecache import optimum, replay
from moecache.demand import Demand
from moecache.policies.farthest_future import FarthestFuture, next_requests

# Within-token orders tried for B_flat (each request's next use: the next token asking for it).
ORDERS = ("recorded", "ascending-id", "soonest-next-first", "latest-next-first")


def within_token(demand: Demand, order: str) -> np.ndarray:
    """The requests [streams, T, k], each token's experts rearranged in `order`."""
    requests = demand.requests
    if order == "recorded":  # as the router ranked them
        return requests
    if order == "ascending-id":
        return np.sort(requests, axis=2)  # padded tokens are all PAD, so stay so
    after = next_requests(requests, demand.num_experts)[0].transpose(1, 0, 2)
    key = after if order == "soonest-next-first" else -after
    # Stable on ties, so equal next uses keep the recorded order.
    return np.take_along_axis(requests, np.argsort(key, axis=2, kind="stable"), axis=2)


def flattened(demand: Demand, order: str) -> Demand:
    """Each token's k experts as k consecutive single-request tokens."""
    requests = within_token(demand, order)
    streams, steps, k = requests.shape
    return Demand(
        demand.streams,
        demand.sequences,
        requests.reshape(streams, steps * k, 1),
        demand.lengths * k,
        demand.num_experts,
    )


def farthest_future(demand: Demand, capacity: int) -> np.ndarray:
    """Greedy farthest-future copies (after_fill) per stream; on single requests this is
    classical MIN (Belady)."""
    policy = FarthestFuture(capacity, demand.num_experts, demand.top_k)
    return replay.run(demand, policy).after_fill


def flat_bound(demand: Demand, capacity: int) -> tuple[np.ndarray, list[str]]:
    """B_flat per stream (the tightest over ORDERS) and the order that gave it."""
    bounds = np.stack([farthest_future(flattened(demand, o), capacity) for o in ORDERS])
    best = bounds.argmax(axis=0)
    return bounds.max(axis=0), [ORDERS[i] for i in best]


def relative_gap(greedy_copies: int, flat: int) -> float | None:
    """How far greedy may lie above the optimum, as a share of the lower bound (None when
    the bound is 0 but greedy is not)."""
    if flat == 0:
        return 0.0 if greedy_copies == 0 else None
    return (greedy_copies - flat) / flat


def report(demand: Demand, capacity: int) -> dict:
    demand.check_capacity(capacity)
    flat, orders = flat_bound(demand, capacity)
    upper = farthest_future(demand, capacity)
    gaps = [relative_gap(int(g), int(f)) for g, f in zip(upper, flat, strict=True)]
    total_flat, total_greedy = int(flat.sum()), int(upper.sum())
    return {
        "capacity": capacity,
        "experts": demand.num_experts,
        "top_k": demand.top_k,
        "orders_tried": list(ORDERS),
        "totals": {
            "b_flat": total_flat,
            "b_greedy": total_greedy,
            "gap": relative_gap(total_greedy, total_flat),
            "streams": len(demand.streams),
            "coincide_share": float(np.mean(upper == flat)),
            "median_stream_gap": statistics.median(g for g in gaps if g is not None),
            "tightest_order_counts": {o: orders.count(o) for o in ORDERS},
        },
        "streams": [
            {
                "stream": name,
                "b_flat": int(f),
                "b_greedy": int(g),
                "gap": gap,
                "tightest_order": order,
            }
            for name, f, g, gap, order in zip(
                demand.streams, flat, upper, gaps, orders, strict=True
            )
        ],
    }


def exact(demand: Demand, capacity: int) -> np.ndarray:
    """B* per stream: the fewest copies of any lossless schedule, prefetching included
    (exact search; small N only), as steady traffic B."""
    demand.check_capacity(capacity)
    best = np.zeros(len(demand.streams), dtype=np.int64)
    for length in np.unique(demand.lengths):
        same = demand.lengths == length
        requests = demand.requests[same, :length]
        best[same] = optimum.exact_insertions(requests, demand.num_experts, capacity)
    return best - np.minimum(capacity, demand.distinct)


def sandwich(demand: Demand, capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """B_flat <= B* <= B_greedy per stream."""
    return (
        flat_bound(demand, capacity)[0],
        exact(demand, capacity),
        farthest_future(demand, capacity),
    )


def optimum_report(demand: Demand, capacity: int) -> dict:
    """B_flat <= B* <= B_greedy per stream and in total."""
    flat, best, upper = sandwich(demand, capacity)
    return {
        "capacity": capacity,
        "experts": demand.num_experts,
        "top_k": demand.top_k,
        "totals": {
            "b_flat": int(flat.sum()),
            "optimum": int(best.sum()),
            "b_greedy": int(upper.sum()),
            "greedy_optimal_share": float(np.mean(upper == best)),
        },
        "streams": [
            {"stream": name, "b_flat": int(f), "optimum": int(b), "b_greedy": int(g)}
            for name, f, b, g in zip(demand.streams, flat, best, upper, strict=True)
        ],
    }
