"""What equation (1) is given for `moecache plan --gpu-gib` (plan/fit.py): tau, one expert
copy (a measured loop's GiB/s, or a stated link's), c, the compute per token (stated, or
a measured run's step less its copies), and rho, the copies per token (a replay of a given
trace at C, the embedded trace's share at the same C/N from the published run's replay
table, or uniform routing's LRU copies); each with where it comes from."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import yaml

from moecache.errors import MoecacheError

GIB = 2**30
RULES = ("lru", "farthest-future")  # the causal rule a cache runs, and the oracle's floor
REPO = Path(__file__).resolve().parents[3]
# The published run's replay of the embedded default, and the config it ran.
EMBEDDED_TABLE = REPO / "docs" / "results" / "table_eviction.csv"
EMBEDDED_CONFIG = REPO / "config" / "config.yaml"


# --- tau ----------------------------------------------------------------------------------


def tau_from_bandwidth(path, expert_bytes: int) -> dict:
    """tau from a bandwidth file (results/bandwidth/{device}.json or measured/gpu-check/
    *.json): its per-expert loop's GiB/s, scaled to this model's expert."""
    from moecache.atomic import read_json

    if not Path(path).is_file():
        raise MoecacheError(f"--bandwidth {path}: no such file")
    measured = read_json(path, "a bandwidth file")
    speed = measured.get("loop_gib_per_s") if isinstance(measured, dict) else None
    if not isinstance(speed, int | float) or speed <= 0:
        raise MoecacheError(
            f"--bandwidth {path}: no loop_gib_per_s (the per-expert loop's GiB/s, as "
            "moecache bandwidth and make gpu-check write it)"
        )
    device = measured.get("device_name") or "its device"
    at = measured.get("expert_bytes")
    size = f" on experts of {at / 2**20:.2f} MiB" if at else ""
    return {
        "ms": 1e3 * expert_bytes / (speed * GIB),
        "gib_per_s": speed,
        "source": f"measured: {path} ({device}, per-expert loop {speed:.2f} GiB/s{size})",
    }


def tau_from_link(gib_per_s: float, expert_bytes: int) -> dict:
    if gib_per_s <= 0:
        raise MoecacheError(f"--link-gbs {gib_per_s:g}: must be above 0")
    return {
        "ms": 1e3 * expert_bytes / (gib_per_s * GIB),
        "gib_per_s": gib_per_s,
        "source": f"stated: a link of {gib_per_s:g} GiB/s (--link-gbs), not measured",
    }


# --- c ------------------------------------------------------------------------------------


def compute_from_run(path, model_source: str) -> dict:
    """c from a decode run's results file (results/runs/...): its step less its copies,
    per timed token (equation (1)'s c), refused for another model's run."""
    from moecache.costs import overlap
    from moecache.records.io import read_run_dict

    if not Path(path).is_file():
        raise MoecacheError(f"--compute-from {path}: no such file")
    run = read_run_dict(path)
    if not run["sequences"]:
        raise MoecacheError(f"--compute-from {path}: a decode run's results without sequences")
    if overlap.timed(run) <= 0:
        raise MoecacheError(f"--compute-from {path}: no timed tokens")
    ran = run.get("settings", {}).get("model", {}).get("source")
    if ran is not None and ran != model_source:
        raise MoecacheError(f"--compute-from {path}: a run of {ran}, not of {model_source}")
    c = overlap.compute_ms(run)
    where = run.get("device_name") or "its device"
    return {"ms": c, "source": f"measured: {path} ({where}, its step less its copies)"}


def stated_compute(ms: float) -> dict:
    if ms < 0:
        raise MoecacheError(f"--compute-ms {ms:g}: must be at least 0")
    return {"ms": ms, "source": "stated (--compute-ms), not measured"}


# --- rho ----------------------------------------------------------------------------------


def rho_from_trace(path, capacity: int, experts: int, top_k: int, layers: int) -> dict:
    """Copies per token over `layers` offloaded layers: each rule replayed on the trace at
    C (steady copies per timed token over the trace's layers, per layer, times `layers`)."""
    from moecache.replay import engine

    traced = traced_demand(path, experts, top_k)
    demand, timed = traced["demand"], traced["timed"]
    rho = {}
    for rule in RULES:
        steady = int(engine.replayed(demand, rule, capacity).steady.sum())
        rho[rule] = steady / timed / traced["layers"] * layers
    return {
        "per_token": rho,
        "source": (
            f"replayed: {path} ({traced['layers']} layers, {timed} timed tokens) at "
            f"C = {capacity}, per layer times {layers} layers"
        ),
    }


def traced_demand(path, experts: int, top_k: int) -> dict:
    """A trace's demand, its layers and timed tokens, refused in one line where it routes
    otherwise than the model or has no token to count."""
    demand = read_trace(path, experts)
    if (demand.num_experts, demand.top_k) != (experts, top_k):
        raise MoecacheError(
            f"--trace {path}: routes top-{demand.top_k} of {demand.num_experts} experts; "
            f"the model routes top-{top_k} of {experts}"
        )
    timed = demand.timed_tokens
    if timed <= 0:
        raise MoecacheError(f"--trace {path}: no token after each sequence's first to count")
    layers = len({stream.split("/")[0] for stream in demand.streams})
    return {"path": path, "demand": demand, "layers": layers, "timed": timed}


def read_trace(path, experts: int):
    """A moecache-trace file, or a harness trace (read with the model's N)."""
    from moecache.records import trace
    from moecache.replay import tracefile

    if tracefile.header(path) is not None:
        return tracefile.read_demand(path)
    return trace.read_demand(path, experts)


def embedded_shares(table=EMBEDDED_TABLE, config=EMBEDDED_CONFIG) -> dict:
    """The published replay of the embedded default: per rule, {C/N: steady copies per
    token per layer}, the mean over its shards; with its N, k and layers."""
    if not (Path(table).is_file() and Path(config).is_file()):
        raise MoecacheError(
            f"{shown(Path(table))}: the published replay is not here to give rho; "
            "give --trace FILE, a trace of this model's routing"
        )
    embedded = yaml.safe_load(Path(config).read_text())
    arch = embedded["model"]["architecture"]
    layers = len(embedded["harness"]["restricted_layers"])
    points: dict[str, dict[float, list[float]]] = {rule: {} for rule in RULES}
    with open(table, newline="") as rows:
        for row in csv.DictReader(rows):
            if row["rule"] in points and int(row["experts"]) == arch["num_experts"]:
                share = int(row["capacity"]) / int(row["experts"])
                per_layer = float(row["copies_per_token"]) / layers
                points[row["rule"]].setdefault(share, []).append(per_layer)
    if not all(len(p) >= 2 for p in points.values()):
        raise MoecacheError(f"{shown(Path(table))}: no LRU and farthest-future rows at two C/N")
    means = {rule: {s: float(np.mean(v)) for s, v in p.items()} for rule, p in points.items()}
    return {
        "shares": means,
        "experts": arch["num_experts"],
        "top_k": arch["num_experts_per_tok"],
        "layers": layers,
        "table": Path(table),
    }


def per_layer_at(shares: dict[float, float], share: float, top_k: int) -> tuple[float, str]:
    """Copies per token per layer at C/N = `share`, linear between the published points
    and C/N = 1 (nothing copied once every expert is resident); below the smallest point,
    that first segment's line, never above top_k (a token needs at most k copies)."""
    xs = sorted(shares) + [1.0]
    ys = [shares[x] for x in xs[:-1]] + [0.0]
    if share >= 1.0:
        return 0.0, "every expert resident"
    if share >= xs[0]:
        how = "as published" if share in shares else "interpolated"
        return float(np.interp(share, xs, ys)), how
    slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
    return min(float(top_k), ys[0] + slope * (share - xs[0])), "extrapolated below"


def rho_embedded(capacity: int, experts: int, top_k: int, layers: int, shares=None) -> dict:
    """rho from the embedded trace's share at this C/N, scaled by k / k_embedded, times the
    offloaded layers: not this model's routing."""
    shares = shares or embedded_shares()
    share = capacity / experts
    rho, how = {}, ""
    for rule in RULES:
        per_layer, how = per_layer_at(shares["shares"][rule], share, shares["top_k"])
        rho[rule] = per_layer * top_k / shares["top_k"] * layers
    points = ", ".join(f"{s:g}" for s in sorted(shares["shares"]["lru"]))
    scale = f", times k/k_embedded = {top_k}/{shares['top_k']}" if top_k != shares["top_k"] else ""
    return {
        "per_token": rho,
        "source": (
            f"{EMBEDDED_SAID} (the embedded trace's share at C/N = {capacity}/{experts} = "
            f"{share:.3f}, not this model's routing: {how} from the published replay at C/N "
            f"= {points}, {shown(shares['table'])}, and nothing copied at C = N; per "
            f"layer{scale}, times {layers} layers)"
        ),
    }


EMBEDDED_SAID = (
    "copies per token from the embedded tiny model's trace, scaled by k; give --trace FILE "
    "of this model's routing for its own"
)


def rho_uniform(capacity: int, experts: int, top_k: int, layers: int) -> dict:
    """LRU's steady copies per token over `layers` offloaded layers when each token requests
    k experts drawn uniformly without replacement from N, independently of every other
    token. Once the pool holds C, the token's k are a uniform k-subset whatever the pool
    holds (the past does not choose them), so k C/N of them hit on average and
    k (1 - C/N) are copied, under LRU or any rule that cannot see the future; which
    experts LRU kept does not matter. Exact in the steady state (tests/test_plan_fit.py
    solves the LRU chain of a small case and replays a seeded uniform trace)."""
    per_layer = top_k * (1 - capacity / experts)
    return {
        "per_layer": per_layer,
        "per_token": {"lru": per_layer * layers},
        "source": (
            f"uniform routing: each token's k = {top_k} experts drawn uniformly from N = "
            f"{experts}, LRU at C = {capacity} copies k (1 - C/N) = {per_layer:.3f} a layer, "
            f"times {layers} layers"
        ),
    }


def shown(path: Path) -> str:
    """A path as the repository names it, where it lies inside."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def tau(expert_bytes: int, bandwidth=None, link_gbs=None) -> dict | None:
    """tau from a bandwidth file, else a stated link, else None (not predicted)."""
    if bandwidth is not None:
        return tau_from_bandwidth(bandwidth, expert_bytes)
    if link_gbs is not None:
        return tau_from_link(link_gbs, expert_bytes)
    return None
