"""The causal rules' study (results/learned/causal.json) for the report: its table part, its
figure (share of the gap against C, one line per rule and shard, the paper's 26.9% and
32.5% marked) and its claim (the best causal rule's held-out share and interval at every
capacity); and their check (results/learned/causal-check.json): closed-loop copies against
replay copies and the cost per decision against the worth of the copies saved, a table part
and the claim's words. It reads both as their records (records/causal.py)."""

from __future__ import annotations

import pandas as pd

from moecache.records.causal import CONTROL, REFERENCES, CausalCheck, CausalStudy
from moecache.records.io import read_record

PAPER = {"decayed frequency (paper)": 0.269, "learned scorers (paper)": 0.325}
TARGET = 0.5  # issue 41: half of the gap at every capacity
REFERENCE_RULE = "lru"  # the causal check times every rule against it


def read(path) -> CausalStudy:
    return read_record(path, CausalStudy)


def is_study(path) -> bool:
    """Whether a --learned file is the causal study (the other is the scorers' evaluation)."""
    return str(path).endswith("causal.json")


def is_check(path) -> bool:
    """Whether a --learned file is the causal rules' closed-loop check and cost."""
    return str(path).endswith("causal-check.json")


def read_check(path) -> CausalCheck:
    return read_record(path, CausalCheck)


def check_frame(check: CausalCheck) -> pd.DataFrame:
    """One row per rule: its closed-loop copies beside its replay's (each closed-loop
    shard's), and its decisions' time against LRU's beside what its saved copies are worth
    at 1x, in microseconds per decision (one layer's plan for one token)."""
    rows = []
    for rule, row in check.cost["rules"].items():
        loops = {shard: rules[rule] for shard, rules in check.closed_loop.items() if rule in rules}
        rows.append(
            {
                "rule": rule,
                "closed_loop_copies": " ".join(f"{s}:{r['copies']}" for s, r in loops.items()),
                "replay_copies": " ".join(f"{s}:{r['replay_copies']}" for s, r in loops.items()),
                "closed_loop_equals_replay": all(r["equal"] for r in loops.values())
                if loops
                else None,
                "us_per_decision": row["ns_per_decision"] / 1e3,
                "extra_us": row["extra_ns"] / 1e3,
                "extra_low": row["extra_interval"][0] / 1e3,
                "extra_high": row["extra_interval"][1] / 1e3,
                "copies_saved_per_decision": row["copies_saved_per_decision"],
                "saved_worth_us": row["worth_ns"] / 1e3,
                "at_1x": "the reference" if rule == REFERENCE_RULE else pays(row),
            }
        )
    return pd.DataFrame(rows)


def pays(row: dict) -> str:
    """Whether a rule's saved copies are worth more than its decisions' extra time at 1x:
    by the whole interval of that extra time, or 'unclear' where the interval spans it."""
    low, high = row["extra_interval"]
    if row["worth_ns"] > high:
        return "saves more than it costs"
    if row["worth_ns"] < low:
        return "costs more than it saves"
    return "unclear"


def check_caption(check: CausalCheck) -> str:
    shards = ", ".join(check.closed_loop)
    return (
        f"The causal rules decoding in the harness at C = {check.capacity} (the first "
        f"sequences of shard {shards}, learned.causal.closed_loop), their copies beside the "
        "same rules replayed on the same sequences; and each rule's decisions (change(), one "
        "layer and token) timed against LRU's on the monotonic clock, interleaved token by "
        f"token, the median of {check.rounds} rounds, on {len(check.cost_sequences)} "
        f"sequences of shard {check.cost_shard} ({check.cost['decisions']} decisions): "
        "microseconds per decision, the extra over LRU's with a 95% paired bootstrap "
        "interval over streams, and the copies the rule saves per decision times one "
        f"expert's copy at 1x ({1e3 * check.tau_ms:.1f} us, the bandwidth record)."
    )


def check_words(check: CausalCheck, rule: str) -> str:
    """`rule`'s closed-loop check and cost, in one sentence for the scorecard."""
    loops = [
        f"{s} {r[rule]['copies']} = {r[rule]['replay_copies']}"
        for s, r in check.closed_loop.items()
    ]
    equal = all(r[rule]["equal"] for r in check.closed_loop.values())
    row = check.cost["rules"][rule]
    low, high = (x / 1e3 for x in row["extra_interval"])
    return (
        f"closed-loop copies {'=' if equal else '!='} replay copies ({', '.join(loops)}); "
        f"its decisions take {row['extra_ns'] / 1e3:+.1f} us [{low:+.1f}, {high:+.1f}] over "
        f"LRU's, its saved copies are worth {row['worth_ns'] / 1e3:.1f} us at 1x: "
        f"{pays(row)}"
    )


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
    "only (its variant and the rule picked on the trace's validation sequences), then "
    "replayed on every sequence of each shard's trace at each capacity: share of "
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


def target_calls(study: CausalStudy) -> tuple[list[str], list[str]]:
    """The best rule's cells that its intervals decide against half of the gap (the whole
    interval below it), and those they cannot decide (the interval straddles it), each as
    'shard C = c: share [low, high]' with, for a straddling one, the sequences at which the
    interval would clear half at this share (an interval narrows as one over the root of
    the sequences)."""
    from moecache.report.power import about, size_to_clear, straddles

    below, straddling = [], []
    for shard, by_c in study.best()["rows"].items():
        for c, row in by_c.items():
            low, high = row["interval"]
            cell = f"{shard} C = {c}: {100 * row['share']:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"
            if high < TARGET:
                below.append(cell)
            elif straddles(row["interval"], TARGET):
                n = len(study.shards[shard][c]["sequences"])
                size = size_to_clear(n, row["share"], row["interval"], TARGET)
                straddling.append(f"{cell}, {about(size)} sequences (here {n})")
    return below, straddling
