"""The tiered replay's grid (results/tiers/grid.json) for the report: its table parts, its
figure (ms per token against C and H, one line per rule x admission) and the sentences
that state its verdicts (report/verdicts/tiers.py decides them). It reads the grid as its
record (records/tiers.py)."""

from __future__ import annotations

import pandas as pd

from moecache.records.io import read_record
from moecache.records.tiers import TiersGrid
from moecache.report.verdicts.tiers import TiersVerdict, tiers_verdict

NO_DISK = "inf"  # how a host of every expert (no disk) shows in the tables and figure


def read(path) -> TiersGrid:
    return read_record(path, TiersGrid)


def verdict_of(grid: TiersGrid) -> TiersVerdict:
    return tiers_verdict(grid.as_dict())


def host_text(host: int | None) -> str:
    return NO_DISK if host is None else str(host)


def frame(grid: TiersGrid) -> pd.DataFrame:
    """One row per cell: shard, C, H, rule, admission, its counts and ms per token."""
    data = pd.DataFrame([{**row, "host": host_text(row["host"])} for row in grid.rows])
    return data[
        ["shard", "capacity", "host", "rule", "admission", "copies", "reads", "computes"]
        + ["ms_per_token"]
    ]


def leads_frame(verdict: TiersVerdict) -> pd.DataFrame:
    """Farthest-future against LRU per cell: copies and ms per token, and the share saved."""
    return pd.DataFrame(
        {
            "shard": x.shard,
            "capacity": x.capacity,
            "host": host_text(x.host),
            "admission": x.admission,
            "copies_lru": x.copies[0],
            "copies_ff": x.copies[1],
            "copies_saved": x.copies_saved,
            "ms_per_token_lru": x.ms_per_token[0],
            "ms_per_token_ff": x.ms_per_token[1],
            "ms_saved": x.ms_saved,
        }
        for x in verdict.leads
    )


def break_even_frame(verdict: TiersVerdict) -> pd.DataFrame:
    """Per rule and cell: always against bypass at the config's prices, and the host
    compute to copy time ratio below which bypass costs less."""
    return pd.DataFrame(
        {
            "shard": x.shard,
            "capacity": x.capacity,
            "host": host_text(x.host),
            "rule": x.rule,
            "ms_per_token_always": x.ms_per_token[0],
            "ms_per_token_bypass": x.ms_per_token[1],
            "winner": x.winner,
            "break_even_ratio": x.ratio,
        }
        for x in verdict.break_evens
    )


CAPTION = (
    "The trace run's demand on each shard replayed over two tiers (moecache tiers-grid, "
    "tiers.grid): the device's C experts per layer over a host of H (inf: every expert, no "
    "disk) over a disk, each device rule with admission always (every miss copied in) and "
    "bypass (a miss computed on the host unless predicted back sooner than the victim), the "
    "host evicting by its own rule. Counts per event; ms per token at the config's prices "
    "(tiers: disk_to_host_ms, host_to_device_ms, host_compute_ms), a plain sum."
)
LEADS_CAPTION = (
    "Farthest-future against LRU in each cell: copies and ms per token, and the share each "
    "saves (negative: farthest-future costs more)."
)
BREAK_EVEN_CAPTION = (
    "Always against bypass per rule at the config's prices, and the break-even ratio: "
    "bypass costs less exactly when a host compute costs less than this many copies (the "
    "counts fix it; with a disk, at the config's disk to copy ratio)."
)


def spread(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{100 * low:.1f}%" if low == high else f"{100 * low:.1f}% to {100 * high:.1f}%"


def verdict_lines(verdict: TiersVerdict) -> list[str]:
    """The verdicts, one sentence each, from the verdict's fields."""
    yes = {True: "yes", False: "no"}
    disk = [x for x in verdict.leads if x.host is not None and x.admission == "always"]
    none = [x for x in verdict.leads if x.host is None and x.admission == "always"]
    bypass = [x for x in verdict.leads if x.admission == "bypass"]
    lines = []
    if none:
        lines.append(
            "Without a disk farthest-future copies "
            f"{spread([x.copies_saved for x in none])} fewer experts than LRU."
        )
    if disk:
        lines.append(
            "Its lead in ms per token survives a disk tier (admission always): "
            f"{yes[verdict.ms_with_disk]} (it saves {spread([x.ms_saved for x in disk])} "
            "over every disk cell)."
        )
    if bypass:
        lines.append(
            "With host compute (bypass) its lead in ms per token survives: "
            f"{yes[verdict.ms_with_compute]} (it saves {spread([x.ms_saved for x in bypass])}); "
            f"its lead in copies: {yes[verdict.copies_with_compute]} (it copies "
            f"{spread([x.copies_saved for x in bypass])} fewer)."
        )
    lines += cheapest_lines(verdict) + admission_lines(verdict)
    return lines


def cheapest_lines(verdict: TiersVerdict) -> list[str]:
    """Which schedule costs least, and in how many cells."""
    if not verdict.cheapest:
        return []
    winners: dict[str, list[str]] = {}
    for (shard, c, h), schedule in verdict.cheapest.items():
        winners.setdefault(schedule, []).append(f"({shard}, {c}, {host_text(h)})")
    said = "; ".join(
        f"{schedule} in {len(cells)} of {len(verdict.cheapest)} cells {' '.join(cells)}"
        for schedule, cells in sorted(winners.items(), key=lambda item: -len(item[1]))
    )
    return [f"The cheapest schedule per (shard, C, H): {said}."]


def admission_lines(verdict: TiersVerdict) -> list[str]:
    evens = verdict.break_evens
    if not evens:
        return []
    wins = sum(x.winner == "bypass" for x in evens)
    where = f"in {wins} of {len(evens)} rule x cell pairs"
    winner = verdict.admission or "it depends on the cell"
    lines = [
        f"At the config's prices (a host compute costs {verdict.price_ratio:.2f} of a copy, "
        f"a disk read {verdict.disk_ratio:.3g} copies) the admission that costs less: "
        f"{winner} (bypass {where})."
    ]
    ratios = [x for x in evens if x.ratio is not None]
    for host in dict.fromkeys(x.host for x in ratios):
        by_c = {}
        for x in ratios:
            if x.host == host:
                by_c.setdefault(x.capacity, []).append(x.ratio)
        said = "; ".join(f"C = {c}: {min(r):.2f} to {max(r):.2f}" for c, r in by_c.items())
        lines.append(
            f"Copying stops paying, H = {host_text(host)}: bypass costs less once a host "
            f"compute costs less than this many copies (by rule and shard), {said}."
        )
    return lines


def figure(path):
    """ms per token against C (log scales): a panel per shard and host size, a line per
    rule (color) and admission (solid: always, dashed: bypass)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    grid = read(path)
    data = frame(grid)
    shards = list(dict.fromkeys(data["shard"]))
    hosts = list(dict.fromkeys(data["host"]))
    fig, axes = plt.subplots(
        len(shards), len(hosts), figsize=(3.6 * len(hosts), 3.0 * len(shards) + 0.9), sharey=True
    )
    axes = pd.DataFrame(axes.reshape(len(shards), len(hosts)), index=shards, columns=hosts)
    colors = dict(zip(grid.rules, plt.get_cmap("tab10").colors, strict=False))
    styles = {"always": "-", "bypass": "--"}
    for (shard, host), part in data.groupby(["shard", "host"], sort=False):
        ax = axes.loc[shard, host]
        for (rule, admission), rows in part.groupby(["rule", "admission"], sort=False):
            rows = rows.sort_values("capacity")
            ax.plot(
                rows["capacity"],
                rows["ms_per_token"],
                color=colors[rule],
                ls=styles.get(admission, ":"),
                marker="o",
                label=f"{rule} / {admission}",
            )
        disk = "no disk" if host == NO_DISK else f"H = {host}"
        ax.set_title(f"shard {shard}, {disk}", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")  # the disk's cells cost several times the others
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(grid.capacities, [str(c) for c in grid.capacities])
        ax.set_xlabel("device capacity C (experts per layer)")
        ax.grid(alpha=0.3)
    for ax in axes.iloc[:, 0]:
        ax.set_ylabel("ms per token (config prices)")
    handles, labels = axes.iloc[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=len(grid.rules))
    fig.suptitle("Two tiers: device over host over disk, or over host compute", fontsize=10)
    fig.tight_layout(rect=(0, 0.8 / fig.get_figheight(), 1, 1))
    return fig, [path]


def lead_texts(verdict: TiersVerdict) -> list[tuple[str, str]]:
    """Per cell (shard first): the shard, and the share of ms per token farthest-future
    saves against LRU under each admission, as 'shard C = c, H = h: x% always, y% bypass'."""
    cells: dict[tuple, list[str]] = {}
    for x in verdict.leads:
        key = (x.shard, x.capacity, host_text(x.host))
        cells.setdefault(key, []).append(f"{100 * x.ms_saved:.1f}% {x.admission}")
    return [
        (shard, f"{shard} C = {c}, H = {h}: {', '.join(saved)}")
        for (shard, c, h), saved in cells.items()
    ]
