"""The largest C that fits a GPU with every MoE layer offloaded, and what it decodes at
(`moecache plan --gpu-gib G`; docs/plan.md).

Sizes come from accountant.account, the function the jobs use, with the config's restricted layers
set to every MoE layer of the adapter and its capacity to each C tried: bytes grow with C,
so C is found by bisection over top_k..N. With `--jobs` C is chosen by the study's jobs
instead (accountant.job_peaks on a card of G GiB: the gates and decode jobs, the all-resident
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
the allocator's fragmentation and activations, which accountant.account does not count), or
--reserve-gib R. Equation (1)'s inputs are read by plan/inputs.py, the answer is said by
plan/said.py, and docs/plan.md's tables are built by plan/cards.py.
"""

from __future__ import annotations

import contextlib
import copy
import io

from moecache.errors import MoecacheError
from moecache.model import registry
from moecache.plan import RESERVE_GIB, tiers
from moecache.plan.inputs import (
    GIB,
    RULES,
    rho_embedded,
    rho_from_trace,
    rho_uniform,
    tau,
    traced_demand,
)
from moecache.schedule import accountant

# --- sizes --------------------------------------------------------------------------------


def sizes(settings: dict, source=None):
    """The model's sizes as its adapter reads them (N, top_k, every MoE layer)."""
    config = accountant.checkpoint_config(settings, source)
    return registry.adapter_for(config.model_type).sizes(config)


def sized(settings: dict, capacity: int, layers, source=None, tokens=None) -> dict:
    """accountant.account at `capacity` with `layers` offloaded (the settings left untouched; the
    decode plan's line that the all-resident reference is left out, said once per size
    tried, is left to the report's `reference_kept`)."""
    settings = copy.deepcopy(settings)
    settings["harness"]["restricted_layers"] = list(layers)
    settings["harness"]["capacity"] = capacity
    with contextlib.redirect_stderr(io.StringIO()):
        return accountant.account(settings, source=source, tokens=tokens)


def on_card(settings: dict, gpu_gib: float) -> dict:
    """The settings with harness.device_gib set to the card's: its jobs leave out the
    all-resident reference where it does not fit (accountant.reference_left_out)."""
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
    them (accountant.job_peaks: the gates job and the decode job, the all-resident reference
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
    own = accountant.account(settings, gpu_gib, source, tokens)
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
