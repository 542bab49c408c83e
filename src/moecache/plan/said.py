"""`moecache plan --gpu-gib`'s answer (plan/fit.py `answer`) as a reader wants it, one fact
a line."""

from __future__ import annotations

from moecache.plan.fit import reserve_said
from moecache.plan.inputs import GIB

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
