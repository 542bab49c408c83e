"""A tiered replay's report: every device rule under each admission, and on request the
optimum per admission, counted per stream, per layer and in total, and priced by the
config's `tiers` section (docs/tiers.md)."""

from __future__ import annotations

import numpy as np

from moecache import config
from moecache.errors import MoecacheError
from moecache.records.batch import layer_of
from moecache.records.demand import Demand
from moecache.replay import tier_bound, tiers

COUNTED = ("copies", "steady", "reads", "computes")
_TOL = 1e-9  # relative: float sums of prices equal up to rounding


def prices(section: dict | None = None) -> dict:
    """The `tiers` section's prices (filled in as it loaded; the schema's defaults when the
    config has no such section); its other keys, the report's grid, are not prices."""
    section = section or config.with_defaults({}, "tiers")
    return {key: value for key, value in section.items() if key.endswith("_ms")}


def event_prices(section: dict) -> tier_bound.Prices:
    return tier_bound.Prices(
        copy=section["host_to_device_ms"],
        read=section["disk_to_host_ms"],
        compute=section["host_compute_ms"],
    )


def report(
    demand: Demand,
    capacity: int,
    host: int | None,
    rules: list[str],
    host_rule: str,
    admissions: list[str],
    section: dict,
    optimum: bool = False,
    optimum_seconds: float | None = None,
) -> dict:
    """Counts and ms of every rule x admission (and the optimum per admission)."""
    for admission in admissions:
        tiers.check_layout(demand, capacity, host, admission)
    price = event_prices(section)
    tokens = int(sum(dict(zip(demand.sequences, demand.lengths.tolist(), strict=True)).values()))
    schedules, kept = {}, {}
    for rule in rules:
        for admission in admissions:
            counts = tiers.run(demand, rule, capacity, host, host_rule, admission, keep=optimum)
            rows = {name: getattr(counts, name) for name in COUNTED}
            schedules[f"{rule}/{admission}"] = tallied(demand, rows, price, tokens)
            kept[f"{rule}/{admission}"] = counts
    if optimum:
        for admission in admissions:
            begin = starts(demand, capacity, host, admission, kept, price)
            bypass = admission == "bypass"
            best = optimal(demand, capacity, host, bypass, price, optimum_seconds, begin)
            check_below(schedules, admission, best, demand)
            schedules[f"optimum/{admission}"] = tallied(demand, best, price, tokens)
    return {
        "capacity": capacity,
        "host": host,
        "host_rule": None if host is None else host_rule,
        "experts": demand.num_experts,
        "top_k": demand.top_k,
        "streams": len(demand.streams),
        "tokens": tokens,
        "prices": section,
        "schedules": schedules,
    }


def starts(demand, capacity, host, admission, kept: dict, price) -> list:
    """Per stream, the cheapest replayed schedule the optimum of `admission` may start
    from: the report's rules (with `always`, those that always admit) and farthest-future
    over a farthest-future host."""
    runs = [c for name, c in kept.items() if admission == "bypass" or name.endswith("/always")]
    oracle = "farthest-future"
    runs.append(tiers.run(demand, oracle, capacity, host, oracle, admission, keep=True))
    cost = np.stack(
        [c.copies * price.copy + c.reads * price.read + c.computes * price.compute for c in runs]
    )
    return [(runs[r].device[s], runs[r].host[s]) for s, r in enumerate(cost.argmin(axis=0))]


def optimal(demand, capacity, host, bypass, price, seconds, starts) -> dict:
    """Per stream: the optimum's counts, its cost, HiGHS's bound and whether they meet;
    each search starts from the stream's schedule in `starts`."""
    found = [
        tier_bound.solve_stream(
            demand.requests[s, : demand.lengths[s]],
            demand.num_experts,
            capacity,
            host,
            bypass,
            price,
            seconds,
            starts[s],
        )
        for s in range(len(demand.streams))
    ]
    rows = {
        name: np.array([getattr(o, name) for o in found]) for name in COUNTED if name != "steady"
    }
    rows["bound_ms"] = np.array([max(o.dual_bound, o.relaxation) for o in found])
    rows["certified"] = np.array([o.certified for o in found])
    rows["seconds"] = np.array([o.seconds for o in found])
    return rows


def check_below(schedules: dict, admission: str, best: dict, demand: Demand) -> None:
    """No rule costs less than the optimum's bound (bypass bounds every admission): a
    violation is a bug, so it stops the job."""
    for name, schedule in schedules.items():
        if admission == "always" and not name.endswith("/always"):
            continue
        cost = np.array([row["ms"] for row in schedule["streams"]])
        under = cost < best["bound_ms"] * (1 - _TOL) - _TOL
        if under.any():
            s = int(np.argmax(under))
            raise MoecacheError(
                f"stream {demand.streams[s]}: {name} costs {cost[s]:g} ms, below the "
                f"{admission} optimum's bound {best['bound_ms'][s]:g}"
            )


def tallied(demand: Demand, rows: dict, price, tokens: int) -> dict:
    """Totals, per layer and per stream of per-stream `rows`, priced."""
    rows = dict(rows)
    rows["ms"] = rows["copies"] * price.copy + rows["reads"] * price.read
    rows["ms"] = rows["ms"] + rows["computes"] * price.compute
    counted = [name for name in (*COUNTED, "ms", "bound_ms") if name in rows]

    def summed(picked) -> dict:
        out = {name: number(rows[name][picked].sum()) for name in counted}
        if "certified" in rows:
            out["certified"] = bool(rows["certified"][picked].all())
            out["certified_streams"] = int(rows["certified"][picked].sum())
            out["seconds"] = float(rows["seconds"][picked].sum())
        return out

    layers = np.array([layer_of(s) for s in demand.streams])
    totals = summed(slice(None))
    totals["ms_per_token"] = totals["ms"] / tokens if tokens else None
    return {
        "totals": totals,
        "layers": {layer: summed(layers == layer) for layer in dict.fromkeys(layers.tolist())},
        "streams": [
            {"stream": name, "tokens": int(n), **{k: number(rows[k][s]) for k in counted}}
            for s, (name, n) in enumerate(zip(demand.streams, demand.lengths, strict=True))
        ],
    }


def number(value):
    """An int count stays int; a price becomes float."""
    return int(value) if np.issubdtype(np.asarray(value).dtype, np.integer) else float(value)
