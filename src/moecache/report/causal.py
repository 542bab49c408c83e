"""The causal rules' study (results/learned/causal.json) for the report: its table part, its
figure (share of the gap against C, one line per rule and shard, the paper's 26.9% and
32.5% marked) and its claim (the best causal rule's held-out share and interval at every
capacity). It reads the study as its record (records/causal.py)."""

from __future__ import annotations

import pandas as pd

from moecache.records.causal import CONTROL, REFERENCES, CausalStudy
from moecache.records.io import read_record

PAPER = {"decayed frequency (paper)": 0.269, "learned scorers (paper)": 0.325}
TARGET = 0.5  # issue 41: half of the gap at every capacity


def read(path) -> CausalStudy:
    return read_record(path, CausalStudy)


def is_study(path) -> bool:
    """Whether a --learned file is the causal study (the other is the scorers' evaluation)."""
    return str(path).endswith("causal.json")


def frame(study: CausalStudy) -> pd.DataFrame:
    """One row per shard, capacity and rule: copies, share of the gap and its interval, and
    the parameters tuned on the training trace."""
    chosen = {name: t["chosen"] for name, t in study.tuning.items()}
    fitted = {**study.next_use["chosen"], "horizon": study.next_use["model"]["horizon"]}
    chosen.update({n: fitted for n in ("next-use", "next-use" + CONTROL)})
    rows = []
    for shard, by_c in study.shards.items():
        for c, result in by_c.items():
            for rule, row in result["rules"].items():
                if rule in REFERENCES:
                    continue
                params = {k: v for k, v in chosen.get(rule, {}).items() if k != "weights"}
                rows.append(
                    {
                        "trace": shard,
                        "capacity": int(c),
                        "rule": rule,
                        "params": " ".join(f"{k}={v}" for k, v in params.items()),
                        "copies": row["copies"],
                        "gap_heldout": row["share"],
                        "gap_low": row["interval"][0],
                        "gap_high": row["interval"][1],
                    }
                )
    return pd.DataFrame(rows)


CAPTION = (
    "Causal rules (learned.causal) tuned, and the next-use model fitted, on the training trace "
    "only, then replayed on every sequence of each shard's trace at each capacity: share of "
    "the LRU-to-farthest-future gap with a 95% percentile bootstrap interval over sequences. "
    "next-use-permuted: the model fitted on shuffled labels (the control)."
)


def figure(path):
    """Share of the gap against C: a line per causal rule (solid: first shard, dashed: the
    others), the paper's two shares and the target marked."""
    import matplotlib.pyplot as plt

    study = read(path)
    data = frame(study)
    fig, ax = plt.subplots(figsize=(7.2, 4.2))
    colors = dict(zip(sorted(set(data["rule"])), plt.get_cmap("tab10").colors, strict=False))
    for i, (shard, part) in enumerate(data.groupby("trace", sort=True)):
        for rule, rows in part.groupby("rule", sort=True):
            rows = rows.sort_values("capacity")
            ax.errorbar(
                rows["capacity"],
                rows["gap_heldout"],
                yerr=[
                    rows["gap_heldout"] - rows["gap_low"],
                    rows["gap_high"] - rows["gap_heldout"],
                ],
                color=colors[rule],
                ls="-" if i == 0 else "--",
                marker="o",
                capsize=3,
                label=f"{rule} (shard {shard})",
            )
    for (name, share), style in zip(PAPER.items(), (":", "-."), strict=True):
        ax.axhline(share, color="grey", ls=style, lw=1, label=f"{name}: {100 * share:.1f}%")
    ax.axhline(TARGET, color="black", lw=0.6, label="half of the gap")
    ax.set_xscale("log", base=2)
    ax.set_xticks(study.capacities, [str(c) for c in study.capacities])
    ax.set_xlabel("pool capacity C (experts per layer)")
    ax.set_ylabel("share of LRU-to-farthest-future gap (held out)")
    ax.set_title("Causal eviction rules, tuned on the training trace", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig, [path]


def best_rule(study: CausalStudy) -> tuple[str, list[str], bool]:
    """The best causal rule's name, its 'shard C: share [low, high]' texts, and whether it
    meets the target everywhere (share >= half, interval's low end above the paper's 32.5%)."""
    best = study.best()
    texts, meets = [], True
    for shard, by_c in best["rows"].items():
        for c, row in by_c.items():
            low, high = row["interval"]
            texts.append(
                f"{shard} C = {c}: {100 * row['share']:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"
            )
            meets &= row["share"] >= TARGET and low > PAPER["learned scorers (paper)"]
    return best["rule"], texts, meets
