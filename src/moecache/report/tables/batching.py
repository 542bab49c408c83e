"""The batching table: copies against the batch size B from the batched replay, and the
harness's batched runs (copies, ms per sequence-token, Delta NLL, prefill apart), with the
verdicts the README states (report/batching.py derives them)."""

from __future__ import annotations

import pandas as pd

from moecache.report import batching
from moecache.report.tables.base import Table


def replay_frame(rows: list[dict]) -> pd.DataFrame:
    """Per shape: LRU's, farthest-future's, decayed frequency's and the best zoo rule's
    copies per sequence-token, the gap shares, and farthest-future's saving."""
    out = []
    for shape in sorted({r["shape"] for r in rows if r["source"] == "replay"}, key=order):
        named = {rule: batching.replayed(rows, shape, rule) for rule in batching.NAMED}
        zoo = batching.best_zoo(rows, shape)
        out.append(
            {
                "B": shape.size,
                "batching": shape.batching,
                "prefill": shape.prefill,
                "widest_union": named[batching.BASELINE]["widest_union"],
                **{f"{rule} copies": r["copies_per_token"] for rule, r in named.items()},
                "best zoo rule": zoo["rule"],
                "best zoo copies": zoo["copies_per_token"],
                "decayed-frequency gap share": named["decayed-frequency"]["gap_recovered"],
                "best zoo gap share": zoo["gap_recovered"],
                "farthest-future saving": batching.oracle_saving(rows, shape),
            }
        )
    return pd.DataFrame(out)


def harness_frame(rows: list[dict]) -> pd.DataFrame:
    out = []
    for r in sorted((r for r in rows if r["source"] == "harness"), key=harness_order):
        low, high = r["ms_ci"]
        out.append(
            {
                "B": r["shape"].size,
                "batching": r["shape"].batching,
                "prefill": r["shape"].prefill,
                "run": r["rule"],
                "copies per sequence-token": r["copies_per_token"],
                "ms per sequence-token": r["ms_per_token"],
                "95% interval": f"{low:.2f}-{high:.2f}",
                "delta NLL": r["delta_nll"],
                "prefill copies per sequence": r["prefill_copies"],
                "prefill ms per sequence": r["prefill_ms"],
            }
        )
    return pd.DataFrame(out).astype(object).where(lambda frame: frame.notna(), "")


def order(shape) -> tuple:
    return (shape.batching != "static", shape.prefill, shape.size)


def harness_order(row) -> tuple:
    return (*order(row["shape"]), row["rule"])


def verdicts(rows: list[dict]) -> list[str]:
    """From the run's numbers: where farthest-future's saving drops below 10% of LRU's
    copies, per batching mode, and how each restricting run's Delta NLL moves with B."""
    lines = []
    for mode in batching.MODES_SHOWN:
        found = batching.small_saving_batch(rows, mode)
        if not found["savings"]:
            continue
        saved = ", ".join(f"B = {b}: {s:.0%}" for b, s in found["savings"].items())
        if found["batch"] is None:
            lines.append(
                f"- {mode} batching: farthest-future saves at least "
                f"{batching.SMALL_SAVING:.0%} of LRU's copies at every B run ({saved})."
            )
        else:
            where = "on" if found["stays"] else "first, not at every larger B"
            lines.append(
                f"- {mode} batching: farthest-future saves less than "
                f"{batching.SMALL_SAVING:.0%} of LRU's copies from B = {found['batch']} {where} "
                f"({saved})."
            )
    for rule, by_b in batching.restricting_quality(rows).items():
        moved = ", ".join(f"B = {b}: {d:+.3f}" for b, d in by_b.items())
        lines.append(f"- {rule} (restricting, static batching): delta NLL {moved}.")
    return lines


def table_batching(replay, batched) -> Table:
    rows = batching.replay_rows(replay) + batching.harness_rows(batched)
    return Table(
        "table_batching",
        "Batched decoding: B sequences share each layer's cache",
        "Replay (first part): the trace run's demand as batched demand (each step the union "
        "of the experts of the B sequences running; docs/batching.md), every lossless rule "
        "at the harness's C over the whole shard; steady copies per sequence-token, the "
        "share of the LRU-to-farthest-future gap, and farthest-future's saving as a share of "
        "LRU's copies. The best zoo rule is the caching literature's rule (the zoo) with the "
        "fewest copies at that shape.",
        {"replay": replay_frame(rows), "harness": harness_frame(rows)},
        [*replay, *batched],
        part_captions={
            "harness": "The harness decoding B sequences at once (harness.batched: the first "
            "sequences of the first shard, each cut to a share of its length): steady copies "
            "and ms per sequence-token (95% interval over the timed steps), Delta NLL against "
            "the unmodified model on the same sequences, and with a prefill its copies and "
            "milliseconds per sequence, apart from decoding's (blank without one)."
        },
        verdicts={"": verdicts(rows)},
    )
