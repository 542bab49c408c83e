"""The batching section: farthest-future's saving over LRU against the batch size B (the
batched replay), the harness's ms per sequence-token at each B, and the verdicts the README
states (report/batching.py, the batching table's)."""

from __future__ import annotations

from pathlib import Path

from moecache.report import batching
from moecache.report.numbers.format import fixed, percent, sig, table
from moecache.report.tables.batching import verdicts


def batching_section(workdir: Path, shard: str) -> str:
    replay = sorted((workdir / f"results/replay/{shard}/batched").glob("*.json"))
    runs = sorted((workdir / f"results/batched/{shard}").glob("*/*.json"))
    if not replay:
        return "Not produced by this run: no batched replay (replay.batch_sizes)."
    rows = batching.replay_rows(replay) + batching.harness_rows(runs)
    parts = [savings_table(rows)]
    if runs:
        parts.append(harness_table(rows))
    parts.append("\n".join(verdicts(rows)))
    return "\n\n".join(parts)


def savings_table(rows: list[dict]) -> str:
    """Per B: LRU's and farthest-future's copies per sequence-token and the saving, for
    each batching mode without prefill (the whole shard, replayed)."""
    header = ["B"]
    modes = [m for m in batching.MODES_SHOWN if batching.shapes(rows, m)]
    for mode in modes:
        header += [f"{mode}: LRU", "farthest-future", "saving"]
    lines = []
    for size in sorted({s.size for m in modes for s in batching.shapes(rows, m)}):
        line = [str(size)]
        for mode in modes:
            shape = next((s for s in batching.shapes(rows, mode) if s.size == size), None)
            lru = batching.replayed(rows, shape, batching.BASELINE) if shape else None
            oracle = batching.replayed(rows, shape, batching.ORACLE) if shape else None
            line += [
                sig(lru and lru["copies_per_token"]),
                sig(oracle and oracle["copies_per_token"]),
                percent(batching.oracle_saving(rows, shape) if shape else None),
            ]
        lines.append(line)
    return table(header, lines)


def harness_table(rows: list[dict]) -> str:
    """Per run and B: ms per sequence-token (95% interval), static batching, no prefill."""
    harness = [
        r
        for r in rows
        if r["source"] == "harness" and r["shape"].batching == "static" and not r["shape"].prefill
    ]
    sizes = sorted({r["shape"].size for r in harness})
    names = list(dict.fromkeys(r["rule"] for r in harness))
    lines = []
    for name in names:
        line = [name]
        for size in sizes:
            found = [r for r in harness if r["rule"] == name and r["shape"].size == size]
            if not found:
                line.append("n/a")
                continue
            low, high = found[0]["ms_ci"]
            line.append(f"{fixed(found[0]['ms_per_token'], 2)} ({fixed(low, 2)}-{fixed(high, 2)})")
        lines.append(line)
    return table(["ms per sequence-token, static", *(f"B = {b}" for b in sizes)], lines)
