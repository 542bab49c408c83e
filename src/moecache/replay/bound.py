"""Bounds on the fewest copies of any lossless schedule (the paper's appendix on optimality).

B_flat <= B* <= B_greedy: B_greedy is farthest-future eviction (per-token semantics, fetch
on demand); B_flat is the classical MIN optimum of the stream flattened into single
requests, a token's experts one after another. Any lossless schedule serves the flattened
stream, in any within-token order, at the same cost, so every order gives a lower bound;
we try several per stream and keep the tightest (the largest). B* itself is exact: the LP
of moecache.replay.lp at any size, with the DP of moecache.replay.optimum as an independent
cross-check where N is small. All counts are the paper's steady traffic B: insertions
beyond the first min(C, distinct) every schedule makes.

With non-unit copy costs (experts kept at mixed precision) farthest-future is no longer
optimal (docs/optimum.md, section 4); `mixed_precision` reports how far it is from the LP.
"""

from __future__ import annotations

import statistics

import numpy as np

from moecache.config.keys import MAX_EXPERTS
from moecache.errors import MoecacheError
from moecache.policies.farthest_future import FarthestFuture, next_requests
from moecache.records import batch as geometry
from moecache.records import counting
from moecache.records.demand import PAD, Demand, subset
from moecache.replay import batch, engine, lp, optimum

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
    """Each token's experts as consecutive single-request tokens (a batched union may
    request fewer than k: its PAD entries are dropped)."""
    requests = within_token(demand, order)
    streams, steps, k = requests.shape
    flat = requests.reshape(streams, steps * k)
    real = flat != PAD
    flat = np.take_along_axis(flat, np.argsort(~real, axis=1, kind="stable"), axis=1)
    return Demand(
        demand.streams,
        demand.sequences,
        flat[..., None],
        real.sum(axis=1),
        demand.num_experts,
    )


def farthest_future(demand: Demand, capacity: int) -> np.ndarray:
    """Greedy farthest-future copies (after_fill) per stream; on single requests this is
    classical MIN (Belady)."""
    if isinstance(demand, batch.Batched):  # unions of many widths: a stream at a time
        return batch.serve(demand, "farthest-future", capacity).after_fill
    policy = FarthestFuture(capacity, demand.num_experts, demand.top_k)
    return engine.run(demand, policy).after_fill


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


LP_MAX_REQUESTS = 1_000_000  # per stream: about a minute of HiGHS at the measured rate


def lp_optimum(demand: Demand, capacity: int) -> lp.Optimum:
    """The LP on every stream (unit costs): B* as `after_fill`, with its integrality."""
    demand.check_capacity(capacity)
    check_lp_size(demand)
    return lp.solve(demand.requests, demand.num_experts, capacity)


def check_lp_size(demand: Demand) -> None:
    """Refuse, in one line, a stream too long for the LP; at unit cost it is not needed."""
    requests = demand.lengths * demand.top_k
    if requests.max(initial=0) > LP_MAX_REQUESTS:
        i = int(np.argmax(requests))
        raise MoecacheError(
            f"stream {demand.streams[i]}: {requests[i]:,} requests, too large for the LP "
            f"(at most {LP_MAX_REQUESTS:,}); at unit cost farthest-future's copies are the "
            "optimum B* (proof: docs/optimum.md), so `moecache replay --rule "
            "farthest-future` gives it"
        )


def check_sandwich(flat, best, upper, where) -> None:
    """B_flat <= B* <= B_greedy is a theorem: a violation is a bug, so it stops the job.
    `where(i)` names item i (a stream, a sweep instance) in the message."""
    broken = (flat > best) | (best > upper)
    if broken.any():
        i = int(np.argmax(broken))
        raise MoecacheError(
            f"{where(i)}: B_flat {flat[i]} <= B* {best[i]} <= B_greedy {upper[i]} fails"
        )


def stream_named(demand: Demand):
    """Names stream i of `demand` in an error message."""
    return lambda i: f"stream {demand.streams[i]}"


def lp_summary(result: lp.Optimum) -> dict:
    return {
        "integral": result.integral,
        "certified": result.certified,
        "max_fractionality": result.max_fractionality,
        "lp_seconds": result.seconds,
    }


def report(demand: Demand, capacity: int, mixed: dict | None = None) -> dict:
    """Bounds per stream and in total; `mixed` ({share, cost, seed}) adds the non-unit-cost
    experiment."""
    return report_parts([demand], capacity, mixed)


def report_parts(parts, capacity: int, mixed: dict | None = None) -> dict:
    """report() over demand in parts (batches of whole streams, moecache.replay.stream),
    each part bounded before the next is read; the mixed-precision costs are drawn per
    layer as the layers first appear, across the parts."""
    names, flat, orders, upper, optima, seconds, rows = [], [], [], [], [], 0.0, []
    draws = None if mixed is None else {"rng": np.random.default_rng(mixed["seed"]), "layers": {}}
    for demand in parts:
        demand.check_capacity(capacity)
        f, o = flat_bound(demand, capacity)
        g = farthest_future(demand, capacity)
        result = lp_optimum(demand, capacity)
        check_sandwich(f, result.after_fill, g, stream_named(demand))
        names += demand.streams
        flat.append(f)
        orders += o
        upper.append(g)
        optima += result.streams
        seconds += result.seconds
        shape = demand.num_experts, demand.top_k
        if draws is not None:
            costs = drawn_costs(demand, mixed["share"], mixed["cost"], draws)
            rows += mixed_rows(demand, capacity, costs)
    result = lp.Optimum(optima, seconds)
    flat, upper, best = np.concatenate(flat), np.concatenate(upper), result.after_fill
    gaps = [relative_gap(int(g), int(f)) for g, f in zip(upper, flat, strict=True)]
    total_flat, total_greedy, total_best = int(flat.sum()), int(upper.sum()), int(best.sum())
    return {
        "capacity": capacity,
        "experts": shape[0],
        "top_k": shape[1],
        "orders_tried": list(ORDERS),
        "totals": {
            "b_flat": total_flat,
            "b_star": total_best,
            "b_greedy": total_greedy,
            "gap": relative_gap(total_greedy, total_flat),
            "greedy_minus_b_star": total_greedy - total_best,
            "greedy_gap": relative_gap(total_greedy, total_best),
            "greedy_optimal": bool((upper == best).all()),
            "greedy_optimal_share": float(np.mean(upper == best)),
            **lp_summary(result),
            "streams": len(names),
            "coincide_share": float(np.mean(upper == flat)),
            "median_stream_gap": statistics.median(g for g in gaps if g is not None),
            "tightest_order_counts": {o: orders.count(o) for o in ORDERS},
        },
        "streams": stream_rows(names, flat, best, upper, gaps, orders, result.streams),
        "mixed_precision": None if mixed is None else mixed_totals(rows, shape[0], **mixed),
    }


def stream_rows(names, flat, best, upper, gaps, orders, optima) -> list[dict]:
    """Each stream's bounds: B_flat, B* and greedy's copies, their gap, and the LP's say."""
    return [
        {
            "stream": name,
            "b_flat": int(f),
            "b_star": int(b),
            "b_greedy": int(g),
            "gap": gap,
            "greedy_optimal": bool(g == b),
            "integral": o.integral,
            "certified": o.certified,
            "tightest_order": order,
        }
        for name, f, b, g, gap, order, o in zip(
            names, flat, best, upper, gaps, orders, optima, strict=True
        )
    ]


def exact(demand: Demand, capacity: int) -> np.ndarray:
    """B* per stream: the fewest copies of any lossless schedule, prefetching included
    (the LP, any N), as steady traffic B."""
    return lp_optimum(demand, capacity).after_fill


def dp(demand: Demand, capacity: int) -> np.ndarray:
    """B* per stream by the DP over all 2^N resident sets (small N only): the LP's
    independent cross-check."""
    demand.check_capacity(capacity)
    best = np.zeros(len(demand.streams), dtype=np.int64)
    for length in np.unique(demand.lengths):
        same = demand.lengths == length
        requests = demand.requests[same, :length]
        # A union narrower than the widest repeats its first expert: the same set.
        requests = np.where(requests == PAD, requests[..., :1], requests)
        best[same] = optimum.exact_insertions(requests, demand.num_experts, capacity)
    return counting.after_fill(best, demand.distinct, capacity)


def check_lp_equals_dp(best, by_dp, where) -> None:
    """Two exact methods that disagree mean a bug in one of them: stop the job. `where(i)`
    names item i in the message."""
    differ = best != by_dp
    if differ.any():
        i = int(np.argmax(differ))
        raise MoecacheError(f"{where(i)}: the LP gives B* {best[i]}, the DP {by_dp[i]}")


def sandwich(demand: Demand, capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """B_flat <= B* <= B_greedy per stream."""
    return (
        flat_bound(demand, capacity)[0],
        exact(demand, capacity),
        farthest_future(demand, capacity),
    )


def optimum_report(demand: Demand, capacity: int) -> dict:
    """B_flat <= B* <= B_greedy per stream and in total; B* from the LP, checked against the
    DP when N <= MAX_EXPERTS (`dp` is None above)."""
    demand.check_capacity(capacity)
    flat = flat_bound(demand, capacity)[0]
    upper = farthest_future(demand, capacity)
    result = lp_optimum(demand, capacity)
    best = result.after_fill
    check_sandwich(flat, best, upper, stream_named(demand))
    by_dp = dp(demand, capacity) if demand.num_experts <= MAX_EXPERTS else None
    if by_dp is not None:
        check_lp_equals_dp(best, by_dp, stream_named(demand))
    return {
        "capacity": capacity,
        "experts": demand.num_experts,
        "top_k": demand.top_k,
        "totals": {
            "b_flat": int(flat.sum()),
            "optimum": int(best.sum()),
            "dp": None if by_dp is None else int(by_dp.sum()),
            "b_greedy": int(upper.sum()),
            "greedy_optimal": bool((upper == best).all()),
            "greedy_optimal_share": float(np.mean(upper == best)),
            **lp_summary(result),
        },
        "streams": [
            {
                "stream": name,
                "b_flat": int(f),
                "optimum": int(b),
                "dp": None if by_dp is None else int(by_dp[i]),
                "b_greedy": int(g),
                "integral": o.integral,
                "certified": o.certified,
            }
            for i, (name, f, b, g, o) in enumerate(
                zip(demand.streams, flat, best, upper, result.streams, strict=True)
            )
        ],
    }


# -- non-unit costs: experts kept at mixed precision -------------------------------------


def mixed_costs(demand: Demand, share: float, cost: float, seed: int) -> np.ndarray:
    """[streams, N] copy cost per expert: in each layer a seeded random `share` of the
    experts is kept at lower precision and costs `cost` a copy, the others 1 (the same
    experts for every sequence, as a deployment would fix them)."""
    draws = {"rng": np.random.default_rng(seed), "layers": {}}
    return drawn_costs(demand, share, cost, draws)


def drawn_costs(demand: Demand, share: float, cost: float, draws: dict) -> np.ndarray:
    """mixed_costs, drawing each layer's costs from draws["rng"] the first time the layer
    is seen (kept in draws["layers"]), so parts of one trace share them."""
    low, per_layer = round(share * demand.num_experts), draws["layers"]
    for layer in dict.fromkeys(map(geometry.layer_of, demand.streams)):  # first-seen order
        if layer not in per_layer:
            costs = np.ones(demand.num_experts)
            costs[draws["rng"].choice(demand.num_experts, low, replace=False)] = cost
            per_layer[layer] = costs
    return np.stack([per_layer[geometry.layer_of(s)] for s in demand.streams])


def mixed_precision(demand: Demand, capacity: int, share: float, cost: float, seed: int) -> dict:
    """The LP's least copy cost against farthest-future's (and the cost-aware greedy that
    evicts the cheapest to reload) under mixed-precision costs. Costs are reload costs:
    the total minus each requested expert's first load, which every schedule pays."""
    demand.check_capacity(capacity)
    rows = mixed_rows(demand, capacity, mixed_costs(demand, share, cost, seed))
    return mixed_totals(rows, demand.num_experts, share, cost, seed)


def mixed_rows(demand: Demand, capacity: int, costs: np.ndarray) -> list[dict]:
    """Per stream: the reload costs of the LP, farthest-future and cheapest-first (the
    farthest-future rule ranking by reload cost first), the rules replayed by the engine."""
    n, rows = demand.num_experts, []
    ff_costs = priced_farthest_future(demand, capacity, costs, cheapest=False)
    cheap_costs = priced_farthest_future(demand, capacity, costs, cheapest=True)
    for s, name in enumerate(demand.streams):
        requests, w = demand.requests[s], costs[s]
        first = float(w[np.unique(requests[requests != PAD])].sum())
        best = lp.solve_stream(requests, n, capacity, w)
        ff, cheap = float(ff_costs[s]), float(cheap_costs[s])
        if min(ff, cheap) < best.cost - 1e-9 * max(1.0, best.cost):
            raise MoecacheError(f"stream {name}: a greedy costs less than the LP's optimum")
        rows.append(
            {
                "stream": name,
                "lp": best.cost - first,
                "farthest_future": ff - first,
                "cheapest": cheap - first,
                "integral": best.integral,
                "certified": best.certified,
                "seconds": best.seconds,
            }
        )
    return rows


def priced_farthest_future(
    demand: Demand, capacity: int, costs: np.ndarray, cheapest: bool
) -> np.ndarray:
    """Per stream, the cost of farthest-future's copies (first loads included) under the
    per-expert `costs` [streams, N]: the rule ranks by next use alone or, `cheapest`, by
    reload cost first. Streams that share costs (a layer's) replay together."""
    out = np.zeros(len(demand.streams))
    prices, group = np.unique(costs, axis=0, return_inverse=True)
    for g, price in enumerate(prices):
        picked = np.flatnonzero(group.reshape(-1) == g)
        part = subset(demand, picked)
        rule = FarthestFuture(
            capacity, part.num_experts, part.top_k, costs=price if cheapest else None
        )
        resident = engine.run(part, rule, keep=True).residents  # [streams, T, N]
        before = np.concatenate([np.zeros_like(resident[:, :1]), resident[:, :-1]], axis=1)
        out[picked] = (resident & ~before).sum(axis=1) @ price  # copies per expert, priced
    return out


def mixed_totals(rows: list[dict], n: int, share: float, cost: float, seed: int) -> dict:
    """The mixed-precision section of a report from its per-stream rows."""
    lp_cost, ff_cost, cheap_cost = (
        sum(r[k] for r in rows) for k in ("lp", "farthest_future", "cheapest")
    )
    tol = 1e-9  # float sums of costs: equal up to rounding counts as optimal
    return {
        "share": share,
        "cost": cost,
        "seed": seed,
        "low_precision_experts": round(share * n),
        "totals": {
            "lp": lp_cost,
            "farthest_future": ff_cost,
            "cheapest": cheap_cost,
            "farthest_future_gap": relative_gap(ff_cost, lp_cost),
            "cheapest_gap": relative_gap(cheap_cost, lp_cost),
            "farthest_future_optimal_share": float(
                np.mean([r["farthest_future"] <= r["lp"] + tol for r in rows])
            ),
            "cheapest_optimal_share": float(
                np.mean([r["cheapest"] <= r["lp"] + tol for r in rows])
            ),
            "integral": all(r["integral"] for r in rows),
            "certified": all(r["certified"] for r in rows),
            "lp_seconds": sum(r["seconds"] for r in rows),
        },
        "streams": rows,
    }
