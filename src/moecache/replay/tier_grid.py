"""The tiered replay over a grid (`moecache tiers-grid`, issue 40 point 4): every device
rule under every admission, at every device capacity C over every host size H (C <= H; None:
no disk), on each trace shard, priced by the config's `tiers` section (docs/tiers.md).

The counts are replay/tiers.py's, cell for cell (tests check them against tiers.run); only
the order of work differs: a device stream does not depend on the host, so each rule,
admission and C replays the device once and hands its misses to the host of every H."""

from __future__ import annotations

from moecache.policies.tiers import DeviceTier, HostTier
from moecache.records import counting
from moecache.records.demand import Demand
from moecache.replay import tier_report, tiers


def grid(
    shards: dict[str, Demand],
    capacities: list[int],
    hosts: list[int | None],
    rules: list[str],
    admissions: list[str],
    host_rule: str,
    section: dict,
) -> dict:
    """The grid's cells as flat rows, with each shard's shape."""
    price = tier_report.event_prices(section)
    rows, shapes = [], {}
    for shard, demand in shards.items():
        tokens = decoded_tokens(demand)
        shapes[shard] = {
            "tokens": tokens,
            "streams": len(demand.streams),
            "experts": demand.num_experts,
            "top_k": demand.top_k,
        }
        for capacity in capacities:
            held = [h for h in hosts if h is None or h >= capacity]
            for h in held:
                for admission in admissions:
                    tiers.check_layout(demand, capacity, h, admission)
            for rule in rules:
                for admission in admissions:
                    device = device_counts(demand, rule, capacity, admission)
                    for h in held:
                        reads = host_reads(demand, device["misses"], h, host_rule)
                        counts = {k: device[k] for k in ("copies", "steady", "computes")}
                        cell = {"shard": shard, "capacity": capacity, "host": h}
                        cell |= {"rule": rule, "admission": admission}
                        rows.append(priced(cell | counts | {"reads": reads}, price, tokens))
    return {
        "capacities": capacities,
        "hosts": hosts,
        "host_rule": host_rule,
        "rules": rules,
        "admissions": admissions,
        "prices": section,
        "shards": shapes,
        "rows": rows,
    }


def decoded_tokens(demand: Demand) -> int:
    """Each sequence's tokens once (all its layers' events count against one token)."""
    return int(sum(dict(zip(demand.sequences, demand.lengths.tolist(), strict=True)).values()))


def device_counts(demand: Demand, rule: str, capacity: int, admission: str) -> dict:
    """The device's totals over every stream, and each stream's misses per token (copied or
    computed: what the host must hold)."""
    device = DeviceTier(tiers.ranked_rule(rule, demand, capacity, "device"), admission)
    copies = steady = requested = 0
    misses = []
    for s in range(len(demand.streams)):
        requests = demand.requests[s, : demand.lengths[s]]
        probs = None if demand.probs is None else demand.probs[s, : demand.lengths[s]]
        per_token, full, missed, _ = tiers.device_stream(device, requests, probs)
        copies += int(per_token.sum())
        steady += int(counting.split(per_token, full)[1].sum())
        requested += sum(len(m) for m in missed)
        misses.append(missed)
    return {"copies": copies, "steady": steady, "computes": requested - copies, "misses": misses}


def host_reads(demand: Demand, misses: list, host: int | None, host_rule: str) -> int:
    """Disk reads of a host of `host` experts serving the device's misses (0: no disk)."""
    if host is None:
        return 0
    keeper = HostTier(tiers.ranked_rule(host_rule, demand, host, "host"))
    return int(sum(tiers.host_stream(keeper, missed, demand.top_k)[0] for missed in misses))


def priced(cell: dict, price, tokens: int) -> dict:
    ms = cell["copies"] * price.copy + cell["reads"] * price.read
    ms += cell["computes"] * price.compute
    return cell | {"ms": float(ms), "ms_per_token": float(ms) / tokens if tokens else None}


def lines(report: dict) -> list[str]:
    """One line per cell: the summary `moecache tiers-grid` prints."""
    out = [f"{'cell':44s} {'copies':>7s} {'reads':>7s} {'computes':>8s} {'ms/token':>9s}"]
    for r in report["rows"]:
        host = "inf" if r["host"] is None else r["host"]
        name = f"{r['shard']} C={r['capacity']} H={host} {r['rule']}/{r['admission']}"
        out.append(
            f"{name:44s} {r['copies']:7d} {r['reads']:7d} {r['computes']:8d} "
            f"{r['ms_per_token']:9.3f}"
        )
    return out
