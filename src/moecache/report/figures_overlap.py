"""The overlap figure: ms per token against the copy multiplier for each overlapped run
(`overlap: true`, dashed) and the blocking run of the same policy (solid, same colour),
with 95% intervals; beside it, the overlapped runs' stall and hidden copy time per token.
Written as `figures.write` writes every figure (PDF, PNG, sources.json)."""

from __future__ import annotations

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from moecache.errors import MoecacheError  # noqa: E402
from moecache.records.io import read_run_dict  # noqa: E402
from moecache.report.tables.overlap import overlapped  # noqa: E402

MULTIPLIER_TICKS = (1, 10, 50)


def policy_key(report: dict) -> tuple:
    """What pairs an overlapped run with its blocking runs: the eviction rule and its
    parameters (tables/overlap.py's blocking_twin, without the multiplier)."""
    return report["policy"], tuple(sorted(report.get("params", {}).items()))


def series(reports: list[dict]) -> dict[str, list[dict]]:
    """The overlapped runs and the blocking runs of their policies, each run's reports in
    multiplier order, by run name (overlapped runs first, in the order they come)."""
    wanted = {policy_key(r) for r in reports if overlapped(r)}
    chosen = [r for r in reports if overlapped(r)]
    chosen += [r for r in reports if not overlapped(r) and policy_key(r) in wanted]
    lines: dict[str, list[dict]] = {}
    for r in chosen:
        lines.setdefault(r["run"], []).append(r)
    return {run: sorted(found, key=lambda r: r["multiplier"]) for run, found in lines.items()}


def fig_overlap(runs, scaled):
    """Left: ms per token against the copy multiplier (log), blocking solid, overlapped
    dashed, one colour per eviction rule, 95% intervals over the timed steps. Right: the
    overlapped runs' stall (compute waiting for copies) and hidden copy ms per token."""
    reports = [read_run_dict(path) for path in [*runs, *scaled]]
    lines = series(reports)
    if not any(overlapped(found[0]) for found in lines.values()):
        raise MoecacheError("fig_overlap: no overlapped run (overlap: true) among --runs/--scaled")
    palette = plt.get_cmap("tab10").colors
    keys = list(dict.fromkeys(policy_key(found[0]) for found in lines.values()))
    colors = {key: palette[i % len(palette)] for i, key in enumerate(keys)}
    fig, (speed, stall) = plt.subplots(1, 2, figsize=(10.4, 4.2), sharex=True)
    for run, found in lines.items():
        color = colors[policy_key(found[0])]
        draw_speed(speed, run, found, color)
        if overlapped(found[0]):
            draw_stall(stall, run, found, color)
    # Log: slower links multiply the blocking runs' ms, and the runs' ratio is what counts.
    speed.set_yscale("log")
    speed.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    speed.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    speed.set_ylabel("ms per token (log)")
    speed.set_title("blocking (solid) and overlapped (dashed) copies", fontsize=10)
    stall.set_ylabel("ms per token, overlapped runs")
    stall.set_title("stall (solid) and copy time hidden under compute (dotted)", fontsize=10)
    for ax in (speed, stall):
        ax.set_xscale("log")
        ax.set_xticks(MULTIPLIER_TICKS)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%gx"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("copy multiplier (copies m times slower)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig, [*runs, *scaled]


def draw_speed(ax, run: str, found: list[dict], color) -> None:
    """One run's ms per token at each of its multipliers, with its 95% interval."""
    ms = [r["totals"]["step_ms"] for r in found]
    low = [m - r["totals"]["step_ms_ci"][0] for m, r in zip(ms, found, strict=True)]
    high = [r["totals"]["step_ms_ci"][1] - m for m, r in zip(ms, found, strict=True)]
    dashed = overlapped(found[0])
    label = f"{run} (overlapped, prefetch {found[0]['prefetch']})" if dashed else run
    ax.errorbar(
        [r["multiplier"] for r in found],
        ms,
        yerr=[low, high],
        fmt="o--" if dashed else "o-",
        color=color,
        ms=4,
        capsize=3,
        elinewidth=0.8,
        label=label,
    )


def draw_stall(ax, run: str, found: list[dict], color) -> None:
    multipliers = [r["multiplier"] for r in found]
    ax.plot(multipliers, [r["totals"]["stall_ms"] for r in found], "o-", color=color, label=run)
    ax.plot(
        multipliers,
        [r["totals"]["hidden_copy_ms"] for r in found],
        "s:",
        color=color,
        label=f"{run}: hidden",
    )
