"""The paper's figures, drawn from the pipeline's results files (PDF and PNG, with a
`<name>.sources.json` beside them, as for the tables)."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from moecache import provenance  # noqa: E402
from moecache.atomic import atomic_file, write_json  # noqa: E402
from moecache.costs import equation  # noqa: E402
from moecache.errors import MoecacheError  # noqa: E402
from moecache.records.bandwidth import BandwidthResult  # noqa: E402
from moecache.records.io import read_dict, read_run_dict  # noqa: E402
from moecache.records.learned import LearnedEvaluation  # noqa: E402
from moecache.records.replay import ForesightResult  # noqa: E402
from moecache.report import batching, causal, figures_overlap, replayed, tiers  # noqa: E402
from moecache.report.tables import scaled_points  # noqa: E402

COLORS = {"preserved": "tab:blue", "restricted": "tab:orange"}


def fig1(runs, scaled, bandwidth):
    """Delta NLL against tokens/s: measured at 1x; equation (1) with every timed copy at
    each higher multiplier, with the runs measured there drawn apart. Every point has its
    95% interval over sequences and its run's name, placed where no other name is."""
    if not bandwidth:
        raise MoecacheError("fig1: give --bandwidth (this machine's tau)")
    own = read_dict(bandwidth[0], BandwidthResult)
    tau1 = equation.tau_1x(own)
    points = [equation.point(read_run_dict(path), tau1, path) for path in runs]
    measured: dict = {}
    for s in scaled_points(scaled):
        measured.setdefault(s.multiplier, {})[s.run] = s
    multipliers = [1, *sorted(measured)]
    taus = {m: equation.tau_at(own, m, bandwidth[0]) for m in multipliers}
    fig, axes = plt.subplots(
        1, len(multipliers), figsize=(4.2 * len(multipliers), 3.8), sharey=True, squeeze=False
    )
    drawn = []
    for ax, m in zip(axes[0], multipliers, strict=True):
        drawn.append([draw_run(ax, p, m, taus[m], measured.get(m, {})) for p in points])
        ax.set_title(
            "measured, 1x copies"
            if m == 1
            else f"equation (1), copies {m:g}x slower\n(tau({m:g}) = {taus[m]:.3g} ms)",
            fontsize=9,
        )
        ax.set_xlabel("tokens / s")
        ax.margins(x=0.12, y=0.35)  # room for the names around the points
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("Delta NLL (nats)")
    fig.legend(handles=fig1_legend(), loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(
        f"Quality against speed as copies get slower (tau(1) = {tau1:.3g} ms; "
        "n = every timed copy)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    for ax, marks in zip(axes[0], drawn, strict=True):  # once the axes have their place
        place_labels(ax, marks)
    return fig, [*runs, *scaled, *bandwidth]


def draw_run(ax, p, m, tau, measured: dict) -> tuple[str, float, float]:
    """One run's point in the panel of multiplier `m` (measured at 1x, else predicted at
    `tau`), and the run repeated at m where it was; returns its name and place."""
    kind = "restricted" if p.restricts else "preserved"
    if m == 1:
        x, (lo, hi), style = p.tokens_per_second, p.tokens_per_second_ci, {"fmt": "o"}
    else:
        x = 1e3 / p.ms_per_token(tau)
        ms = p.predicted_interval(tau)
        lo, hi = (x, x) if ms is None else (1e3 / ms[1], 1e3 / ms[0])
        style = {"fmt": "^", "alpha": 0.8}
    bar = {"ms": 6, "capsize": 2, "elinewidth": 0.8, "color": COLORS[kind], **style}
    ax.errorbar(x, p.delta_nll, xerr=[[max(x - lo, 0)], [max(hi - x, 0)]], **bar)
    if p.run in measured:
        # The run repeated at m, joined to its prediction so each square has a name.
        real = measured[p.run]
        rx, (rlo, rhi) = real.tokens_per_second, real.tokens_per_second_ci
        ax.plot([x, rx], [p.delta_nll] * 2, color="grey", lw=0.8, ls=":")
        square = {"fmt": "s", "mfc": "none", "mec": "black", "ecolor": "black", "ms": 8}
        ax.errorbar(
            rx,
            p.delta_nll,
            xerr=[[max(rx - rlo, 0)], [max(rhi - rx, 0)]],
            capsize=3,
            elinewidth=0.8,
            **square,
        )
    return p.run, x, p.delta_nll


def fig1_legend() -> list:
    line = plt.Line2D
    return [
        line([], [], color=COLORS["preserved"], marker="o", ls="", label="routing preserved"),
        line([], [], color=COLORS["restricted"], marker="o", ls="", label="routing restricted"),
        line([], [], color="grey", marker="^", ls="", label="predicted, c + n tau(m)"),
        line(
            [],
            [],
            color="grey",
            marker="s",
            mec="black",
            mfc="none",
            ls=":",
            lw=0.8,
            label="measured at m, joined to its prediction",
        ),
        line([], [], color="grey", marker="|", ls="-", lw=0.8, label="95% interval"),
    ]


# Where a name may go, in points from its point: nearest first, eight directions a ring.
LABEL_OFFSETS = [
    (round(r * dx), round(r * dy))
    for r in (5, 12, 20, 30, 42, 56, 72, 90)
    for dx, dy in ((1, 0.4), (-1, 0.4), (1, -0.6), (-1, -0.6), (0, 1), (0, -1.2), (1, 1), (-1, 1))
]
MARKER_POINTS = 4  # half the side of the square a marker keeps free of names


def place_labels(ax, marks) -> None:
    """Name every (name, x, y) of `marks` at the nearest offset where its text box lies
    inside the axes and clear of every name and marker placed; past a few points from its
    marker a thin line leads to it."""
    renderer = ax.figure.canvas.get_renderer()
    pad = MARKER_POINTS * ax.figure.dpi / 72
    taken = []
    for _, x, y in marks:
        px, py = ax.transData.transform((x, y))
        taken.append(Bbox.from_extents(px - pad, py - pad, px + pad, py + pad))
    for name, x, y in marks:
        taken.append(place(ax, name, x, y, taken, renderer))


def place(ax, name: str, x: float, y: float, taken: list, renderer):
    """The first offset that fits; where none does (a panel too crowded), the one that
    covers the least of the boxes taken, so the figure is still drawn. Returns its box."""
    inside = ax.get_window_extent(renderer)
    best = None
    for dx, dy in LABEL_OFFSETS:
        text = label(ax, name, x, y, dx, dy)
        text.update_positions(renderer)  # placed as drawing would place it
        box = Text.get_window_extent(text, renderer)  # the name's box, its line apart
        outside = not (inside.x0 <= box.x0 and box.x1 <= inside.x1)
        outside = outside or not (inside.y0 <= box.y0 and box.y1 <= inside.y1)
        covered = sum(covered_area(box.padded(1), other) for other in taken)  # touch: clash
        if best is None or (outside, covered) < best[0]:
            if best is not None:
                best[1].remove()
            best = ((outside, covered), text, box)
        else:
            text.remove()
        if best[0] == (False, 0):
            break
    return best[2]


def covered_area(a, b) -> float:
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return max(width, 0) * max(height, 0)


def label(ax, name: str, x: float, y: float, dx: int, dy: int):
    far = abs(dx) > 6 or abs(dy) > 6
    return ax.annotate(
        name,
        (x, y),
        xytext=(dx, dy),
        textcoords="offset points",
        fontsize=7,
        ha="left" if dx > 0 else "right" if dx < 0 else "center",
        va="bottom" if dy > 0 else "top" if dy < 0 else "center",
        arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "grey"} if far else None,
    )


def fig2(foresight, learned):
    """Share of the LRU-to-oracle gap against foresight k: one curve per capacity (the
    `foresight` results of one shard, one file a capacity), on the held-out sequences where
    there are any. Beside each, in its colour, its best causal rule, and at the capacity
    the learned scorers were evaluated at, the best scorer of each group."""
    curves = sorted(
        (read_dict(path, ForesightResult) for path in foresight), key=lambda c: c["capacity"]
    )
    shard = replayed.shard_of(foresight[0])
    evaluation = (
        read_dict(learned[0], LearnedEvaluation) if learned else {"shards": {}, "capacity": None}
    )
    scored = evaluation["shards"].get(shard)
    fig, ax = plt.subplots(figsize=(8.4, 4.2))
    colors = plt.get_cmap("tab10").colors
    for color, curve in zip(colors, curves, strict=False):
        subset = "heldout" if curve["subsets"]["heldout"]["streams"] else "all"
        draw_curve(ax, curve, subset, color)
        # The learned scorers were evaluated at one capacity (the harness's).
        at = curve["capacity"] == evaluation.get("capacity")
        extra = best_scorers(scored, subset) if at else {}
        draw_references(ax, curve, subset, color, extra)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_xlabel("foresight k (tokens of future demand)")
    ax.set_ylabel("share of LRU-to-oracle gap recovered")
    ax.set_title(f"How far ahead eviction needs to see (shard {shard})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig, [*foresight, *learned[:1]]


def draw_curve(ax, curve, subset, color) -> None:
    finite = [p for p in curve["subsets"][subset]["foresight"] if p["k"] is not None]
    if any(p["gap_recovered"] is None for p in finite):
        return
    ax.plot(
        [p["k"] for p in finite],
        [p["gap_recovered"] for p in finite],
        "o-",
        color=color,
        lw=2,
        zorder=3,
        label=f"C = {curve['capacity']}: foresight k ({subset} sequences)",
    )


def best_scorers(scored, subset) -> dict:
    """The best learned scorer of each group (group/kind), controls aside."""
    best = {}
    for name, row in (scored["replay"][subset] if scored else {}).items():
        group = name.split("/")[0]
        if "/" in name and not name.endswith("-permuted") and row["gap_recovered"] is not None:
            if group not in best or row["gap_recovered"] > best[group][1]:
                best[group] = (name, row["gap_recovered"])
    return {f"learned {name}": share for name, share in best.values()}


def draw_references(ax, curve, subset, color, extra) -> None:
    """The best causal rule and decayed frequency (the paper's), then `extra`, as dotted
    lines in the curve's colour: the eviction table has every rule."""
    causal = {r: v for r, v in curve["subsets"][subset]["causal"].items() if v is not None}
    if not causal:
        return
    best = max(sorted(causal), key=causal.get)
    lines = {best: causal[best], **extra}
    if "decayed-frequency" in causal:
        lines.setdefault("decayed-frequency", causal["decayed-frequency"])
    styles = [(0, (1, 1)), (0, (4, 2)), (0, (6, 2, 1, 2)), (0, (2, 3))]
    for i, (rule, share) in enumerate(sorted(lines.items(), key=lambda item: -item[1])):
        ax.axhline(
            share,
            ls=styles[i % len(styles)],
            lw=1.1,
            color=color,
            alpha=0.8,
            label=f"C = {curve['capacity']}: {rule} {share:.0%} (causal)",
        )


def fig_batching(replay, batched):
    """Against the batch size B, static and continuous batching side by side: copies per
    sequence-token (lines: the batched replay of the whole shard; markers: the harness's
    batched runs), ms per sequence-token (the harness, 95% intervals), and the share of
    the LRU-to-farthest-future gap each causal rule recovers, beside farthest-future's
    saving as a share of LRU's copies (below 10%: the eviction rule stops mattering)."""
    if not replay or not batched:
        raise MoecacheError("fig_batching: give --replay (batched replays) and --batched")
    rows = batching.replay_rows(replay) + batching.harness_rows(batched)
    fig, axes = plt.subplots(3, 2, figsize=(9.6, 9.0), sharex=True, sharey="row")
    for column, mode in enumerate(batching.MODES_SHOWN):
        draw_batching_column(axes[:, column], rows, mode)
        axes[0, column].set_title(f"{mode} batching", fontsize=10)
        axes[2, column].set_xlabel("batch size B")
    axes[0, 0].set_ylabel("copies per sequence-token")
    axes[1, 0].set_ylabel("ms per sequence-token")
    axes[2, 0].set_ylabel("share")
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.grid(alpha=0.3)
    for ax in axes[:, 1]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig, [*replay, *batched]


def draw_batching_column(axes, rows, mode: str) -> None:
    """One batching mode's three panels (copies, ms, shares) at no prefill."""
    shapes = batching.shapes(rows, mode)
    sizes = [s.size for s in shapes]
    colors = dict(zip(batching.SHOWN, plt.get_cmap("tab10").colors, strict=False))
    zoo = [batching.best_zoo(rows, s) for s in shapes]
    lines = {rule: [batching.replayed(rows, s, rule) for s in shapes] for rule in batching.NAMED}
    for name, found in {**lines, "best zoo": zoo}.items():
        label = "best zoo rule" if name == "best zoo" else name
        line(
            axes[0],
            sizes,
            [r["copies_per_token"] for r in found],
            colors[name],
            "-",
            f"{label} (replay)",
        )
    draw_harness_points(axes[:2], [r for r in rows if r["shape"] in shapes], colors)
    for name in ("decayed-frequency", "best zoo"):
        found = lines.get(name, zoo)
        line(
            axes[2],
            sizes,
            [r["gap_recovered"] for r in found],
            colors[name],
            "s-",
            f"{name}: share of the LRU-to-oracle gap",
        )
    line(
        axes[2],
        sizes,
        [batching.oracle_saving(rows, s) for s in shapes],
        colors[batching.ORACLE],
        "^--",
        "farthest-future: saving, share of LRU's",
    )
    axes[2].axhline(batching.SMALL_SAVING, color="grey", lw=0.8, ls=":")


def line(ax, x, y, color, style: str, label: str) -> None:
    ax.plot(x, y, style, color=color, label=label)


def draw_harness_points(axes, rows, colors) -> None:
    """The harness's batched runs: copies (top) and ms per sequence-token with its 95%
    interval (middle), one colour a run."""
    harness = [r for r in rows if r["source"] == "harness"]
    for r in harness:
        color = colors.get(r["rule"], colors["other"])
        low, high = r["ms_ci"]
        axes[0].plot(r["shape"].size, r["copies_per_token"], "o", color=color, ms=4)
        spread = [[r["ms_per_token"] - low], [high - r["ms_per_token"]]]
        axes[1].errorbar(
            r["shape"].size, r["ms_per_token"], yerr=spread, fmt="o", color=color, ms=4
        )
    for rule in dict.fromkeys(r["rule"] for r in harness):
        line(axes[1], [], [], colors.get(rule, colors["other"]), "o", f"{rule} (harness)")


def write(name: str, fig, sources, out_dir) -> None:
    out_dir = Path(out_dir)
    for suffix in ("pdf", "png"):
        with atomic_file(out_dir / f"{name}.{suffix}") as tmp:
            fig.savefig(
                tmp, format=suffix, dpi=150, metadata={"Title": name} if suffix == "pdf" else None
            )
    plt.close(fig)
    write_json(out_dir / f"{name}.sources.json", provenance.sources(sources))


def fig_causal(learned):
    """The causal rules' share of the gap against C (report/causal.py)."""
    studies = [p for p in learned if causal.is_study(p)]
    if not studies:
        raise MoecacheError("fig_causal: give --learned results/learned/causal.json")
    return causal.figure(studies[0])


def fig_tiers(tiers_grid):
    """ms per token against C and H, a line per rule x admission (report/tiers.py)."""
    if not tiers_grid:
        raise MoecacheError("fig_tiers: give --tiers-grid results/tiers/grid.json")
    return tiers.figure(tiers_grid[0])


# Name -> (builder, the input flags it reads: its parameters); `moecache figure` refuses others.
BUILDERS = {
    "fig1": (fig1, ("runs", "scaled", "bandwidth")),
    "fig2": (fig2, ("foresight", "learned")),
    "fig_batching": (fig_batching, ("replay", "batched")),
    "fig_overlap": (figures_overlap.fig_overlap, ("runs", "scaled")),
    "fig_causal": (fig_causal, ("learned",)),
    "fig_tiers": (fig_tiers, ("tiers_grid",)),
}
