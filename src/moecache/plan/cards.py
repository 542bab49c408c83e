"""docs/plan.md's tables: per config and GPU size, the C that fits with every MoE layer
offloaded (`table`), and the card configs' C chosen by the study's jobs (`cards_table`)."""

from __future__ import annotations

from pathlib import Path

from moecache import config as configs_module
from moecache.config import keys
from moecache.errors import MoecacheError
from moecache.plan import RESERVE_GIB
from moecache.plan.fit import TooSmall, answer, device_peak, jobs_peak, largest_capacity
from moecache.plan.inputs import GIB, shown

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
    found = {m for run in runs for m in keys.run_multipliers(run)}
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
