"""The largest C that fits a GPU with every MoE layer offloaded, and what it decodes at
(`moecache plan --gpu-gib G`; docs/plan.md).

Sizes come from plan.plan, the function the jobs use, with the config's restricted layers
set to every MoE layer of the adapter and its capacity to each C tried: bytes grow with C,
so C is found by bisection over top_k..N. With `--jobs` C is chosen by the study's jobs
instead (plan.job_peaks on a card of G GiB: the gates and decode jobs, the all-resident
reference where it fits, scaled runs, rings), below N as a config's C must be: the card
configs of config/cards/ hold it. The speed is equation (1),

    ms/token = c + rho * tau,

with tau one expert copy (its bytes over a measured loop's GiB/s, or a stated link's), rho
the copies per token over every offloaded layer (a replay of a given trace at C, or the
embedded trace's share at the same C/N from the published run's replay table, named as
such, with uniform routing's LRU copies, k (1 - C/N) a layer, as the range's other end:
a router that reuses nothing beyond chance), and c the compute per token (stated, or a
measured run's); without c only the copy part is predicted, as a bound. Copies that
overlap compute come at best to max(c, rho tau) (docs/overlap.md); the overlap cost model
with no prefetcher and nothing computed before a layer's copies is equation (1). With
--host-gib short of every offloaded expert, tiers.py lays out H experts per layer in host
RAM over disk and adds the disk reads' term.

The bytes fill G less a stated reserve (plan/__init__.py's RESERVE_GIB: the CUDA context,
the allocator's fragmentation and activations, which plan.plan does not count), or
--reserve-gib R.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import io
from pathlib import Path

import numpy as np
import yaml

from moecache import config as configs_module
from moecache.errors import MoecacheError
from moecache.model import registry
from moecache.plan import RESERVE_GIB, tiers
from moecache.schedule import plan

GIB = 2**30
RULES = ("lru", "farthest-future")  # the causal rule a cache runs, and the oracle's floor
REPO = Path(__file__).resolve().parents[3]
# The published run's replay of the embedded default, and the config it ran.
EMBEDDED_TABLE = REPO / "docs" / "results" / "table_eviction.csv"
EMBEDDED_CONFIG = REPO / "config" / "config.yaml"


# --- sizes --------------------------------------------------------------------------------


def sizes(settings: dict, source=None):
    """The model's sizes as its adapter reads them (N, top_k, every MoE layer)."""
    config = plan.checkpoint_config(settings, source)
    return registry.adapter_for(config.model_type).sizes(config)


def sized(settings: dict, capacity: int, layers, source=None, tokens=None) -> dict:
    """plan.plan at `capacity` with `layers` offloaded (the settings left untouched; the
    decode plan's line that the all-resident reference is left out, said once per size
    tried, is left to the report's `reference_kept`)."""
    settings = copy.deepcopy(settings)
    settings["harness"]["restricted_layers"] = list(layers)
    settings["harness"]["capacity"] = capacity
    with contextlib.redirect_stderr(io.StringIO()):
        return plan.plan(settings, source=source, tokens=tokens)


def on_card(settings: dict, gpu_gib: float) -> dict:
    """The settings with harness.device_gib set to the card's: its jobs leave out the
    all-resident reference where it does not fit (plan.reference_left_out)."""
    settings = copy.deepcopy(settings)
    settings["harness"]["device_gib"] = gpu_gib
    return settings


def device_peak(report: dict) -> int:
    """What one run decoding at C holds on the device, as a server would: the resident
    weights, C slots per offloaded layer and the KV cache (plan's device_bytes). The study's
    own jobs hold more beside it (the all-resident reference, scaled runs' twins, the slower
    link's ring: plan's device_peak_bytes, reported as the config's own run)."""
    return report["device_bytes"]


def jobs_peak(report: dict) -> int:
    """What the study's jobs hold on the device at their peak, as the accountant counts
    them (plan.job_peaks: the gates job and the decode job, the all-resident reference
    where harness.device_gib keeps it, the scaled runs' twins and multipliers in lockstep,
    the slower link's rings)."""
    return report["device_peak_bytes"]


# What C is chosen by: one run decoding at C (as a server would), or the study's jobs.
FIGURES = {"run": device_peak, "jobs": jobs_peak}


def host_peak(report: dict) -> int:
    """What one run at C holds in host memory: every offloaded expert, pinned (the study's
    slower link adds its host ring: plan's host_peak_bytes)."""
    return report["pinned_host_bytes"]


RESERVE_SAID = "in reserve for the CUDA context and the allocator (--reserve-gib)"


def check_reserve(reserve_gib: float, gpu_gib: float | None = None) -> None:
    """A negative reserve, or one that leaves nothing of the card, refused in one line."""
    if reserve_gib < 0:
        raise MoecacheError(f"--reserve-gib {reserve_gib:g}: must be at least 0")
    if gpu_gib is not None and reserve_gib >= gpu_gib:
        raise MoecacheError(
            f"--reserve-gib {reserve_gib:g}: leaves nothing of the {gpu_gib:g} GiB GPU "
            "(give a smaller reserve, or --reserve-gib 0 to fill the card)"
        )


def reserve_said(reserve_gib: float) -> str:
    """The reserve as the answer states it."""
    if reserve_gib == 0:
        return "keeping nothing in reserve (--reserve-gib 0: the card filled to the byte)"
    return f"keeping {reserve_gib:g} GiB {RESERVE_SAID}"


class TooSmall(MoecacheError):
    """Even C = top_k does not fit; `smallest` is the plan at C = top_k."""

    def __init__(self, message: str, smallest: dict):
        super().__init__(message)
        self.smallest = smallest


def largest_capacity(
    settings: dict,
    gpu_gib: float,
    source=None,
    tokens=None,
    figure: str = "run",
    reserve_gib: float = RESERVE_GIB,
) -> dict:
    """The plan at the largest C (top_k <= C <= N) whose `figure` (FIGURES: one run's
    device peak, or the study's jobs' on a card of `gpu_gib`, harness.device_gib set to
    it) fits `gpu_gib` less `reserve_gib` with every MoE layer offloaded, and at C + 1
    (None at C = N, for the jobs at C = N - 1); one line when even C = top_k does not
    fit."""
    check_reserve(reserve_gib, gpu_gib)
    peak = FIGURES[figure]
    if figure == "jobs":
        settings = on_card(settings, gpu_gib)
    shape = sizes(settings, source)
    layers, top_k, experts = shape.moe_layers, shape.num_experts_per_tok, shape.num_experts
    budget = (gpu_gib - reserve_gib) * GIB

    def at(c: int) -> dict:
        return sized(settings, c, layers, source, tokens)

    smallest = at(top_k)
    if peak(smallest) > budget:
        what = "the study's jobs need" if figure == "jobs" else "needs"
        raise TooSmall(
            f"--gpu-gib {gpu_gib:g}: even C = top_k = {top_k} with all {len(layers)} MoE "
            f"layers offloaded {what} {peak(smallest) / GIB:.3f} GiB on the device, more "
            f"than the {gpu_gib - reserve_gib:g} GiB left, {reserve_said(reserve_gib)}",
            smallest,
        )
    # A study's C stays below N (config.py: at C = N nothing is offloaded, nothing to
    # study); one run may hold every expert.
    most = experts - 1 if figure == "jobs" else experts
    fits, over = top_k, most + 1  # fits(fits) holds; over is the first known not to
    while over - fits > 1:
        middle = (fits + over) // 2
        if peak(at(middle)) <= budget:
            fits = middle
        else:
            over = middle
    return {"chosen": at(fits), "next": at(fits + 1) if fits < most else None}


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


# --- the answer ---------------------------------------------------------------------------


def predictions(rho: dict, tau: dict | None, compute: dict | None, reads=None, disk=None) -> dict:
    """Per rule: rho and, with tau, the copy part rho tau; with a disk tier (`reads` per
    token per rule, `disk` one read's tau_disk) the read part reads tau_disk beside it;
    with c too, equation (1)'s ms/token (c + rho tau + reads tau_disk) and tokens/s and
    the overlapped best case max(c, rho tau, reads tau_disk) (the disk and the link are
    two links); without c the transfers are a bound (ms/token at least, tokens/s at
    most). Nothing on disk: reads and their ms are 0 and the rest as without a disk.
    None where not predicted."""
    out = {}
    for rule, copies in rho.items():
        read = reads[rule] if reads else 0.0
        read_ms = read * disk["ms"] if disk else 0.0
        copy_ms = copies * tau["ms"] if tau else None
        moved = copy_ms + read_ms if tau else None  # x + 0.0 is x: no disk, no change
        ms = compute["ms"] + moved if compute and tau else None
        bound = moved if tau and not compute else None
        best = max(compute["ms"], copy_ms, read_ms) if ms is not None else None
        out[rule] = {
            "rho": copies,
            "copy_ms": copy_ms,
            "reads": read,
            "read_ms": read_ms,
            "ms_per_token": ms,
            "tokens_per_second": 1e3 / ms if ms else None,
            "overlapped_ms_at_best": best,
            "ms_per_token_at_least": bound,
            "tokens_per_second_at_most": 1e3 / bound if bound else None,
        }
    return out


def tau(expert_bytes: int, bandwidth=None, link_gbs=None) -> dict | None:
    """tau from a bandwidth file, else a stated link, else None (not predicted)."""
    if bandwidth is not None:
        return tau_from_bandwidth(bandwidth, expert_bytes)
    if link_gbs is not None:
        return tau_from_link(link_gbs, expert_bytes)
    return None


def answer(
    settings: dict,
    gpu_gib: float,
    host_gib: float | None = None,
    source=None,
    tokens=None,
    bandwidth=None,
    link_gbs=None,
    compute: dict | None = None,
    trace=None,
    figure: str = "run",
    disk_gbs: float | None = None,
    reserve_gib: float = RESERVE_GIB,
) -> dict:
    """The whole answer as data; nothing is read but configs and the files named. `trace`:
    replayed for rho (None: the embedded trace's share) and, with experts on disk only,
    over the tiers for the disk reads; `figure`: what C is chosen by (FIGURES);
    `host_gib`: the host RAM, which sets the tier layout (tiers.layout); `disk_gbs`: a
    stated disk link (else the config's tiers.disk_to_host_ms); `reserve_gib`: kept back
    from `gpu_gib` (RESERVE_GIB); `config_run`: the config's own run (its C on its layers),
    its `fits` whether its jobs' peak fits the card less the reserve."""
    check_given(trace, bandwidth, link_gbs, host_gib, disk_gbs)
    check_reserve(reserve_gib, gpu_gib)
    own = plan.plan(settings, gpu_gib, source, tokens)
    own["fits"] = own["device_peak_bytes"] <= (gpu_gib - reserve_gib) * GIB  # one verdict
    found = largest_capacity(settings, gpu_gib, source, tokens, figure, reserve_gib)
    chosen, nxt = found["chosen"], found["next"]
    peak = FIGURES[figure]
    host = host_peak(chosen) if figure == "run" else chosen["host_peak_bytes"]
    layout = tiers.layout(chosen, host, host_gib)
    copy = tau(chosen["expert_bytes"], bandwidth, link_gbs)
    return {
        "source": chosen["source"],
        "family": chosen["family"],
        "dtype": chosen["dtype"],
        "gpu_gib": gpu_gib,
        "reserve_gib": reserve_gib,
        "host_gib": host_gib,
        "capacity": chosen["capacity"],
        "num_experts": chosen["num_experts"],
        "top_k": chosen["top_k"],
        "offloaded_layers": chosen["offloaded_layers"],
        "expert_bytes": chosen["expert_bytes"],
        "chosen_by": figure,
        "device_peak_bytes": peak(chosen),
        "host_peak_bytes": host,
        "host_load_peak_bytes": chosen.get("host_load_peak_bytes"),  # each job's load phase
        "job_host_peak_bytes": chosen.get("job_host_peak_bytes"),
        "next_device_peak_bytes": peak(nxt) if nxt else None,
        "layout": layout,
        "plan": chosen,
        "tau": copy,
        "compute": compute,
        **speeds(settings, chosen, layout, trace, copy, compute, disk_gbs),
        "config_run": own,
    }


def speeds(settings, chosen: dict, layout: dict, trace, copy, compute, disk_gbs) -> dict:
    """rho (replayed from `trace`, else the embedded trace's share, `rho_from` saying
    which), the disk's part, the predictions per rule, and uniform routing's LRU copies
    (rho_uniform) with their prediction beside them (`predicted_uniform`; with a disk
    tier its reads assumed as without a trace, uniform routing being what that assumes)."""
    c, n, k = chosen["capacity"], chosen["num_experts"], chosen["top_k"]
    layers = len(chosen["offloaded_layers"])
    if trace is not None:
        rho = rho_from_trace(trace, c, n, k, layers)
    else:
        rho = rho_embedded(c, n, k, layers)
    disk = disk_part(settings, chosen, layout, rho, trace, disk_gbs)
    uniform = rho_uniform(c, n, k, layers)
    if layout["disk"]:
        reads = tiers.reads_assumed(uniform["per_token"], c, layout["host"], n)["per_token"]
    else:
        reads = None
    return {
        "disk_read": disk["tau"],
        "rho_from": "trace" if trace is not None else "embedded",
        "rho_source": rho["source"],
        "reads_source": disk["reads"]["source"],
        "predicted": predictions(
            rho["per_token"], copy, compute, disk["reads"]["per_token"], disk["tau"]
        ),
        "rho_uniform": uniform,
        "predicted_uniform": predictions(uniform["per_token"], copy, compute, reads, disk["tau"]),
    }


def check_given(trace, bandwidth, link_gbs, host_gib, disk_gbs) -> None:
    """The files and flags, refused in one line before any sizing."""
    if trace is not None:
        from moecache.replay import tracefile

        tracefile.header(trace)  # a missing or non-Parquet file
    tau(1, bandwidth, link_gbs)  # a bad bandwidth file or link
    check_host(host_gib, disk_gbs)


def check_host(host_gib: float | None, disk_gbs: float | None) -> None:
    """The host and disk flags, refused in one line before sizing."""
    if host_gib is not None and host_gib <= 0:
        raise MoecacheError(f"--host-gib {host_gib:g}: must be above 0")
    if disk_gbs is not None:
        if host_gib is None:
            raise MoecacheError("--disk-gbs: give --host-gib R, the host RAM over the disk")
        tiers.check_disk_gbs(disk_gbs)


def disk_part(settings: dict, chosen: dict, layout: dict, rho: dict, trace, disk_gbs) -> dict:
    """With experts on disk only: tau_disk and the disk reads per token (the trace replayed
    over the tiers, else assumed from rho, named as such); nothing on disk: no reads."""
    if not layout["disk"]:
        return {"tau": None, "reads": tiers.no_reads(RULES)}
    c, h, n = layout["device"], layout["host"], chosen["num_experts"]
    layers = len(chosen["offloaded_layers"])
    if trace is not None:
        traced = traced_demand(trace, n, chosen["top_k"])
        reads = tiers.reads_replayed(traced, c, h, layers, RULES)
    else:
        reads = tiers.reads_assumed(rho["per_token"], c, h, n)
    return {"tau": tiers.disk_read(chosen["expert_bytes"], settings, disk_gbs), "reads": reads}


RING_SAID = ", with the slower link's host ring where a scaled run makes one)"


def jobs_said(fit: dict) -> str:
    """With C chosen by the study's jobs: each job's peak and whether the all-resident
    reference is kept."""
    if fit.get("chosen_by") != "jobs":
        return ""
    chosen = fit["plan"]
    jobs = ", ".join(
        f"{job} {b / GIB:.3f} GiB" for job, b in chosen["job_device_peak_bytes"].items()
    )
    kept = "kept" if chosen["reference_kept"] else "left out"
    return f" for the study's jobs ({jobs}; the all-resident reference {kept})"


def lines(fit: dict) -> list[str]:
    """The answer as a reader wants it, one fact a line."""
    gib = lambda b: f"{b / GIB:.3f} GiB"  # noqa: E731
    layers = fit["offloaded_layers"]
    nxt = fit["next_device_peak_bytes"]
    out = [
        f"fit: {fit['source']} ({fit['family']}, {fit['dtype']}) on a {fit['gpu_gib']:g} GiB "
        f"GPU, every MoE layer offloaded ({len(layers)} layers, {fit['num_experts']} experts "
        f"top-{fit['top_k']}), {reserve_said(fit['reserve_gib'])}",
        f"  C = {fit['capacity']} experts per layer (one expert "
        f"{fit['expert_bytes'] / 2**20:.2f} MiB)",
        f"  device peak: {gib(fit['device_peak_bytes'])}{jobs_said(fit)}"
        + (
            f" (C = {fit['capacity'] + 1} would need {gib(nxt)})"
            if nxt
            else " (every expert resident)"
            if fit["capacity"] == fit["num_experts"]
            else " (the most a study holds: at C = N nothing is offloaded)"
        ),
        host_line(fit),
        f"  rho from {fit['rho_source']}"
        if fit["rho_from"] == "trace"
        else f"  rho: {fit['rho_source']}",
        *disk_lines(fit),
        *given_lines(fit),
        *prediction_lines(fit),
    ]
    layout = fit["layout"]
    out.append(
        f"  layout per layer: C = {layout['device']} on the device, H = {layout['host']} in "
        f"host RAM, {layout['disk']} on disk only"
    )
    own = fit["config_run"]
    out.append(
        f"  the config's own study (C = {own['capacity']} on {len(own['offloaded_layers'])} "
        f"layers, its jobs' peak): {gib(own['device_peak_bytes'])}"
        + (f" beside the {fit['reserve_gib']:g} GiB reserve" if fit["reserve_gib"] else "")
        + (", fits" if own["fits"] else ": does NOT fit")
    )
    return out


def given_lines(fit: dict) -> list[str]:
    """tau and c, each with where it comes from, or what is not predicted without it."""
    tau, compute = fit["tau"], fit["compute"]
    disk = fit["disk_read"] is not None
    parts = "the copy and disk read parts are" if disk else "the copy part is"
    return [
        f"  tau = {tau['ms']:.4f} ms per expert copy, {tau['source']}"
        if tau
        else "  tau: not given (--bandwidth FILE or --link-gbs X): ms/token not predicted",
        f"  c = {compute['ms']:.3f} ms/token compute, {compute['source']}"
        if compute
        else f"  c: not given (--compute-ms or --compute-from): only {parts} predicted, "
        "a lower bound on ms/token",
    ]


def prediction_lines(fit: dict) -> list[str]:
    """Each rule's line; without a trace LRU's is a range, the embedded model's share to
    uniform routing's, with uniform routing's own line after the rules."""
    disk = fit["disk_read"] is not None
    ranged = fit["rho_from"] == "embedded"
    out = [
        rule_line(rule, row, disk, fit["predicted_uniform"].get(rule) if ranged else None)
        for rule, row in fit["predicted"].items()
    ]
    if ranged:
        uniform = fit["rho_uniform"]
        embedded = fit["predicted"]["lru"]["rho"]
        total = uniform["per_token"]["lru"]
        times = f", {total / embedded:.1f} times the embedded model's" if embedded else ""
        out.append(
            f"  {uniform['source']} = {total:.3f} copies/token{times} (no reuse beyond "
            "chance: the pessimistic end for a router whose tokens share experts)"
        )
    return out


def host_line(fit: dict) -> str:
    """Every offloaded expert pinned in host RAM, or with a disk tier the H that fit."""
    layout = fit["layout"]
    if not layout["disk"]:
        return (
            f"  host peak: {fit['host_peak_bytes'] / GIB:.3f} GiB (the offloaded experts, pinned"
            + (RING_SAID if fit.get("chosen_by") == "jobs" else ")")
            + (f", of {fit['host_gib']:g} GiB" if fit["host_gib"] is not None else "")
        )
    beside = layout["host_beside_bytes"]
    return (
        f"  host: H = {layout['host']} experts per layer, {layout['host_bytes'] / GIB:.3f} GiB "
        f"of {fit['host_gib']:g} GiB (their pinned copies in {len(fit['offloaded_layers'])} "
        "layers"
        + (f" beside the slower link's host ring, {beside / GIB:.3f} GiB" if beside else "")
        + f"; every offloaded expert would need {layout['every_expert_host_bytes'] / GIB:.3f}"
        " GiB)"
    )


def disk_lines(fit: dict) -> list[str]:
    """With experts on disk only: how many, where their reads come from, what one costs."""
    disk = fit["disk_read"]
    if disk is None:
        return []
    return [
        f"  disk: N - H = {fit['layout']['disk']} experts per layer on disk only; reads from "
        f"{fit['reads_source']}",
        f"  tau_disk = {disk['ms']:.4f} ms per expert read, {disk['source']}",
    ]


def rule_line(rule: str, row: dict, disk: bool, uniform: dict | None = None) -> str:
    """One rule's copies (and disk reads) per token and what they cost; with `uniform`,
    uniform routing's row, each figure a range from `row`'s to its."""

    def val(key: str, digits: int = 3) -> str:
        shown = lambda v: "-" if v is None else f"{v:.{digits}f}"  # noqa: E731
        return shown(row[key]) + ("" if uniform is None else f" to {shown(uniform[key])}")

    if uniform is None:
        line = f"  {rule}: rho = {row['rho']:.3f} copies/token"
    else:
        line = (
            f"  {rule}: rho between {row['rho']:.3f} (embedded model, scaled) and "
            f"{uniform['rho']:.3f} (uniform routing) copies/token"
        )
    formula, bound, moved = "c + rho tau", "rho tau", "copies"
    if disk:
        line += f", {val('reads')} disk reads/token"
        formula, bound = formula + " + reads tau_disk", bound + " + reads tau_disk"
        moved = "copies and reads"
    if row["ms_per_token"] is not None:
        line += (
            f", {val('ms_per_token')} ms/token = {formula} "
            f"({val('tokens_per_second', 1)} tokens/s); {moved} overlapping compute at "
            f"best {val('overlapped_ms_at_best')} ms/token"
        )
    elif row["ms_per_token_at_least"] is not None:
        speed = row["tokens_per_second_at_most"]
        line += f", ms/token >= {bound} = {val('ms_per_token_at_least')}" + (
            f" (at most {val('tokens_per_second_at_most', 1)} tokens/s)" if speed else ""
        )
    elif disk:
        line += f" (reads tau_disk = {val('read_ms')} ms/token)"
    return line


# --- the table of docs/plan.md --------------------------------------------------------------


def table(configs, gibs, bandwidth=None, reserve_gib: float = RESERVE_GIB) -> str:
    """Markdown: per config and GPU size, C with every MoE layer offloaded within the GPU
    less `reserve_gib`, the device and host peaks, rho (the embedded trace's share, and
    LRU's under uniform routing) and the copies' GiB per token, and with a bandwidth file
    the copy part of ms/token at its measured link, at both ends of LRU's range."""
    head = [
        "model",
        "GPU GiB",
        "C / N",
        "device peak GiB",
        "C + 1 needs GiB",
        "host GiB",
        "LRU rho",
        "LRU rho, uniform routing",
        "farthest-future rho",
        "LRU GiB copied / token",
    ]
    if bandwidth is not None:
        head += ["LRU ms/token >= rho tau", "uniform ms/token >= rho tau"]
    rows = []
    for path in configs:
        settings = configs_module.load(path)
        for gib in gibs:
            try:
                fit = answer(settings, gib, bandwidth=bandwidth, reserve_gib=reserve_gib)
            except TooSmall as small:
                need = device_peak(small.smallest) / GIB
                k = small.smallest["capacity"]
                none = f"none (C = {k} needs {need:.2f} of {gib - reserve_gib:g})"
                rows.append([settings["model"]["source"], f"{gib:g}", none])
                continue
            rows.append(table_row(fit, bandwidth is not None))
    return markdown(head, rows)


def table_row(fit: dict, timed: bool) -> list[str]:
    """One answer as a row of `table`."""
    lru, oracle = fit["predicted"]["lru"], fit["predicted"]["farthest-future"]
    uniform = fit["predicted_uniform"]["lru"]
    nxt = fit["next_device_peak_bytes"]
    row = [
        fit["source"],
        f"{fit['gpu_gib']:g}",
        f"{fit['capacity']} / {fit['num_experts']}",
        f"{fit['device_peak_bytes'] / GIB:.2f}",
        f"{nxt / GIB:.2f}" if nxt else "-",
        f"{fit['host_peak_bytes'] / GIB:.2f}",
        f"{lru['rho']:.2f}",
        f"{uniform['rho']:.2f}",
        f"{oracle['rho']:.2f}",
        f"{lru['rho'] * fit['expert_bytes'] / GIB:.3f}",
    ]
    if timed:
        row += [f"{lru['copy_ms']:.2f}", f"{uniform['copy_ms']:.2f}"]
    return row


def markdown(head: list[str], rows: list[list[str]]) -> str:
    """A Markdown table, short rows (a config that fits at no C) padded with empty cells."""
    width = len(head)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * width]
    for row in rows:
        lines.append("| " + " | ".join(row + [""] * (width - len(row))) + " |")
    return "\n".join(lines)


# --- the card configs' table (docs/plan.md) -------------------------------------------------


def cards(configs, gibs=()) -> list[tuple[Path, dict, float]]:
    """(path, settings, card GiB) per config and card: a config's own harness.device_gib
    where it sets one, else each of `gibs`."""
    out = []
    for path in configs:
        settings = configs_module.load(path)
        own = settings["harness"].get("device_gib")
        for gib in [own] if own is not None else gibs:
            out.append((Path(path), settings, gib))
    if not out:
        raise MoecacheError("--jobs: no card: give --gpu-gib G or configs with harness.device_gib")
    return out


def scaled_multipliers(settings: dict) -> str:
    """The copy multipliers above 1 that the config's runs decode at, or "none"."""
    runs = settings["harness"]["runs"].values()
    found = {m for run in runs for m in configs_module.run_multipliers(run)}
    return ", ".join(str(m) for m in sorted(found - {1})) or "none"


def none_fits(smallest: dict, gib: float, reserve_gib: float = RESERVE_GIB) -> str:
    """Why no C fits a card less its reserve: one run at C = top_k already needs more (no
    study can fit), else the study's jobs at C = top_k do."""
    k, run, left = smallest["capacity"], device_peak(smallest), gib - reserve_gib
    if run > left * GIB:
        return f"none (one run at C = {k} needs {run / GIB:.2f} of {left:g})"
    return f"none (the jobs at C = {k} need {jobs_peak(smallest) / GIB:.2f} of {left:g})"


def cards_table(configs, gibs=(), reserve_gib: float = RESERVE_GIB) -> str:
    """Markdown: per config and card, C chosen by the study's jobs with every MoE layer
    offloaded within the card less `reserve_gib` (largest_capacity's "jobs" figure), the
    multipliers its scaled runs decode at, whether the all-resident reference is kept,
    each job's device peak, what C + 1 would need and what one run at C holds."""
    head = [
        "config",
        "card GiB",
        "C / N",
        "scaled runs at",
        "reference",
        "gates GiB",
        "decode GiB",
        "C + 1 needs GiB",
        "one run at C GiB",
    ]
    rows = []
    for path, settings, gib in cards(configs, gibs):
        try:
            found = largest_capacity(settings, gib, figure="jobs", reserve_gib=reserve_gib)
        except TooSmall as small:
            why = none_fits(small.smallest, gib, reserve_gib)
            rows.append([shown(path.resolve()), f"{gib:g}", why])
            continue
        chosen, nxt = found["chosen"], found["next"]
        jobs = chosen["job_device_peak_bytes"]
        rows.append(
            [
                shown(path.resolve()),
                f"{gib:g}",
                f"{chosen['capacity']} / {chosen['num_experts']}",
                scaled_multipliers(settings),
                "kept" if chosen["reference_kept"] else "left out",
                f"{jobs['gates'] / GIB:.2f}",
                f"{jobs['decode'] / GIB:.2f}",
                f"{jobs_peak(nxt) / GIB:.2f}" if nxt else "-",
                f"{device_peak(chosen) / GIB:.2f}",
            ]
        )
    return markdown(head, rows)
