"""The numbers section `tiers` (docs/tiers.md's block): the tiered replay's grid
(results/tiers/grid.json) as ms per token per shard, C and H for each rule x admission, the
break-even ratio of host compute to copy time per rule, then the verdicts
(report/verdicts/tiers.py decides them, report/tiers.py words them)."""

from __future__ import annotations

from pathlib import Path

from moecache.report.numbers.format import fixed, table


def tiers_section(workdir: Path) -> str:
    from moecache.report import tiers, tiers_measured

    path = workdir / "results/tiers/grid.json"
    if not path.exists():
        return "No tiered replay in this run (the config has no `tiers.grid`)."
    grid = tiers.read(path)
    verdict = tiers.verdict_of(grid)
    data = tiers.frame(grid)
    schedules = [f"{r} / {a}" for r in grid.rules for a in grid.admissions]
    cells = list(dict.fromkeys(zip(data["shard"], data["capacity"], data["host"], strict=True)))
    ms = {
        (r.shard, r.capacity, r.host, f"{r.rule} / {r.admission}"): r.ms_per_token
        for r in data.itertuples()
    }
    costs = table(
        ["shard", "C", "H", *schedules],
        ([s, c, h, *(fixed(ms.get((s, c, h, n)), 2) for n in schedules)] for s, c, h in cells),
    )
    ratio = {
        (x.shard, x.capacity, tiers.host_text(x.host), x.rule): x.ratio for x in verdict.break_evens
    }
    evens = table(
        ["shard", "C", "H", *grid.rules],
        ([s, c, h, *(fixed(ratio.get((s, c, h, r)), 2) for r in grid.rules)] for s, c, h in cells),
    )
    p = grid.prices
    measured = sorted(workdir.glob("results/tiers/harness/*.json"))
    checked = tiers_measured.lines(tiers_measured.read(measured[0])) if measured else []
    return "\n\n".join(
        [
            f"ms per token at the config's prices (a disk read {p['disk_to_host_ms']:g} ms, a "
            f"copy {p['host_to_device_ms']:g} ms, a host compute {p['host_compute_ms']:g} ms; "
            f"H = inf: no disk; the host evicts by {grid.host_rule}):",
            costs,
            "Break-even ratio per rule: bypass costs less than always exactly when a host "
            "compute costs less than this many copies (at the config's disk to copy ratio):",
            evens,
            "\n".join(f"- {line}" for line in tiers.verdict_lines(verdict) + checked),
        ]
    )
