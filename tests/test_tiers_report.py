"""The tiers' report (issue 40 point 4): `moecache tiers-grid` counts every cell as
`replay --tiers` does; the verdicts (report/verdicts/tiers.py) follow from the counts (the
break-even ratio is where always and bypass cost the same); the table, figure, numbers
section and scorecard row read the grid's record; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
from conftest import moecache
from hypothesis import given, settings
from hypothesis import strategies as st

from moecache import config
from moecache.errors import MoecacheError
from moecache.records.demand import read_jsonl
from moecache.records.io import read_record, write_record
from moecache.records.tiers import TiersGrid
from moecache.replay import tier_grid, tier_report, tiers
from moecache.report import tiers as report
from moecache.report.claim_checks import learned as claim_checks
from moecache.report.evidence import HOLDS, Missing, Results
from moecache.report.numbers.tiers import tiers_section
from moecache.report.tables import tiers as table
from moecache.report.verdicts.tiers import tiers_verdict

EMBEDDED = Path(__file__).parent / "data" / "embedded-a-demand.jsonl"
GRID = {
    "capacities": [12, 16],
    "hosts": [16, 32, "inf"],
    "rules": ["lru", "farthest-future", "decayed-frequency"],
    "admissions": ["always", "bypass"],
}


def as_trace(path: Path) -> Path:
    """The embedded demand (2 sequences x 4 layers) as a harness trace (parquet)."""
    demand = read_jsonl(EMBEDDED, 64)
    rows = []
    for s, stream in enumerate(demand.streams):
        layer, seq = (
            int(part.removeprefix(name))
            for part, name in zip(stream.split("/"), ("layer", "seq"), strict=True)
        )
        for t in range(demand.lengths[s]):
            rows.append(
                {
                    "sequence": seq,
                    "layer": layer,
                    "token": t,
                    "requested": demand.requests[s, t].tolist(),
                    "probs": [0.0] * 64,
                }
            )
    pd.DataFrame(rows).to_parquet(path)
    return path


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A run folder whose results/tiers/grid.json `moecache tiers-grid` wrote."""
    folder = tmp_path_factory.mktemp("tiers")
    trace = as_trace(folder / "a.parquet")
    out = folder / "results/tiers/grid.json"
    settings_json = json.dumps({"seed": 0, "hub_offline": True, "tiers": {"grid": GRID}})
    done = moecache(
        "tiers-grid", "--settings", settings_json, "--trace", f"a={trace}", f"b={trace}",
        "--out", out,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "a C=12 H=16 lru/always" in done.stdout
    return folder


@pytest.fixture(scope="module")
def grid(workdir) -> TiersGrid:
    return read_record(workdir / "results/tiers/grid.json", TiersGrid)


def test_every_cell_counts_as_the_tiered_replay(grid):
    demand = read_jsonl(EMBEDDED, 64)
    # C <= H: at C = 16 the host of 16 holds as many as the device, at C = 12 every H runs.
    assert len(grid.rows) == 2 * (3 + 3) * 3 * 2
    for row in (r for r in grid.rows if r["shard"] == "a"):  # shard b: the same trace
        counts = tiers.run(
            demand, row["rule"], row["capacity"], row["host"], "lru", row["admission"]
        )
        found = [row[name] for name in ("copies", "steady", "reads", "computes")]
        assert found == [int(getattr(counts, n).sum()) for n in tiers.COUNTS], row
    # Each sequence's tokens once, whatever its layers.
    layer0 = [s.startswith("layer0/") for s in demand.streams]
    tokens = int(demand.lengths[layer0].sum())
    assert grid.shards["a"]["tokens"] == tokens
    assert grid.prices == tier_report.prices()


def test_a_host_below_the_device_is_left_out():
    demand = read_jsonl(EMBEDDED, 64)
    price = tier_report.prices()
    found = tier_grid.grid({"a": demand}, [16], [8, None], ["lru"], ["always"], "lru", price)
    assert [row["host"] for row in found["rows"]] == [None]


def priced(rows: list[dict], copy: float, read: float, compute: float) -> list[dict]:
    """The rows at other prices: the counts do not change."""
    out = []
    for row in rows:
        ms = row["copies"] * copy + row["reads"] * read + row["computes"] * compute
        out.append({**row, "ms": ms, "ms_per_token": ms / 512})
    return out


@settings(max_examples=25, deadline=None)
@given(copy=st.floats(0.1, 2.0), disk=st.floats(0.0, 20.0), below=st.booleans())
def test_the_break_even_ratio_is_where_always_and_bypass_cost_the_same(grid, copy, disk, below):
    verdict = tiers_verdict(grid.as_dict() | {"prices": prices(disk * copy, copy, 0.25 * copy)})
    for x in (x for x in verdict.break_evens if x.ratio is not None and x.ratio > 0):
        # At a host compute just below (above) the ratio, bypass costs less (more).
        compute = x.ratio * copy * (0.99 if below else 1.01)
        cells = [
            r
            for r in priced(grid.rows, copy, disk * copy, compute)
            if (r["shard"], r["capacity"], r["host"], r["rule"])
            == (x.shard, x.capacity, x.host, x.rule)
        ]
        cost = {r["admission"]: r["ms"] for r in cells}
        assert (cost["bypass"] < cost["always"]) == below


def prices(disk: float, copy: float, compute: float) -> dict:
    return {"disk_to_host_ms": disk, "host_to_device_ms": copy, "host_compute_ms": compute}


def test_the_verdicts_follow_the_cells(grid):
    verdict = report.verdict_of(grid)
    assert len(verdict.leads) == 2 * 6 * 2  # (shard, C, H, admission)
    assert verdict.admission in ("always", "bypass", None)
    for (shard, c, h), schedule in verdict.cheapest.items():
        costs = {
            f"{r['rule']} / {r['admission']}": r["ms_per_token"]
            for r in grid.rows
            if (r["shard"], r["capacity"], r["host"]) == (shard, c, h)
        }
        assert costs[schedule] == min(costs.values())
    assert len(verdict.cheapest) == 2 * 6
    rows = [dict(r) for r in grid.rows]
    # Farthest-future made dearer than LRU in one disk cell: the lead no longer survives.
    for row in rows:
        if (row["rule"], row["host"], row["admission"]) == ("farthest-future", 16, "always"):
            row["ms_per_token"] = 1e9
            break
    worse = tiers_verdict(grid.as_dict() | {"rows": rows})
    assert verdict.ms_with_disk and not worse.ms_with_disk
    assert worse.ms_with_compute == verdict.ms_with_compute


def test_copying_always_wins_where_a_host_compute_costs_more_than_any_break_even(grid):
    dear = max(x.ratio for x in report.verdict_of(grid).break_evens if x.ratio) * 2
    rows = priced(grid.rows, 1.0, 10.0, dear)
    verdict = tiers_verdict(grid.as_dict() | {"rows": rows, "prices": prices(10.0, 1.0, dear)})
    assert verdict.admission == "always"
    assert "the admission that costs less: always" in " ".join(report.verdict_lines(verdict))


def test_the_table_figure_numbers_and_claim_read_the_grid(workdir, tmp_path):
    path = workdir / "results/tiers/grid.json"
    made = table.table_tiers([path])
    assert set(made.parts) == {"", "ff_vs_lru", "break_even"}
    assert len(made.parts[""]) == len(read_record(path, TiersGrid).rows)
    assert set(made.parts[""]["host"]) == {"16", "32", "inf"}
    assert made.verdict_lines() and "Not produced" in table.table_tiers([]).caption
    matplotlib.use("Agg")
    fig, sources = report.figure(path)
    assert sources == [path] and len(fig.axes) == 2 * 3
    section = tiers_section(workdir)
    assert "| a | 12 | 16 |" in section and "Copying stops paying, H = inf" in section
    assert "no `tiers.grid`" in tiers_section(tmp_path)
    found = claim_checks.tiers_lead(Results(workdir, ["a"]))
    assert found.value.startswith("a C = 12, H = 16: ") and found.elsewhere[0].startswith("b ")
    assert found.verdict == HOLDS  # farthest-future wins every cell of this demand
    with pytest.raises(Missing, match="no tiered replay's grid"):
        claim_checks.tiers_lead(Results(tmp_path, ["a"]))


def test_the_record_round_trips(grid, tmp_path):
    write_record(tmp_path / "g.json", grid)
    assert read_record(tmp_path / "g.json", TiersGrid) == grid


def test_the_config_schema_holds_the_grid():
    settings = {"seed": 0, "hub_offline": True, "tiers": {"grid": GRID}}
    config.validate_schema(settings, required=("seed", "tiers"))
    for bad in ({"admissions": ["maybe"]}, {"hosts": [0]}, {"hosts": ["all"]}):
        with pytest.raises(MoecacheError):
            config.validate_schema(
                {**settings, "tiers": {"grid": GRID | bad}}, required=("seed", "tiers")
            )
    assert list(tier_report.prices(settings["tiers"])) == [
        "disk_to_host_ms",
        "host_to_device_ms",
        "host_compute_ms",
    ]


@pytest.mark.parametrize(
    "tiers_section, traces, message",
    [
        ({}, ["a=t.parquet"], "the config has no tiers.grid section"),
        ({"grid": GRID | {"shards": ["c"]}}, ["a=t.parquet"], "no --trace for shard c"),
        ({"grid": GRID}, ["t.parquet"], "give shard=path"),
        ({"grid": GRID}, ["a=missing.parquet"], "no such trace"),
        ({"grid": GRID | {"rules": ["fifo"]}}, ["a=TRACE"], "rule fifo: the tiers run"),
    ],
)
def test_bad_input_is_one_line(tmp_path, tiers_section, traces, message):
    trace = as_trace(tmp_path / "t.parquet")
    settings_json = json.dumps({"seed": 0, "hub_offline": True, "tiers": tiers_section})
    traces = [t.replace("TRACE", str(trace)) for t in traces]
    done = moecache(
        "tiers-grid", "--settings", settings_json, "--trace", *traces,
        "--out", tmp_path / "g.json",
    )  # fmt: skip
    assert done.returncode != 0 and not done.stdout
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "g.json").exists()


def test_no_negative_reads_or_computes(grid):
    data = pd.DataFrame(grid.rows)
    assert (data[["copies", "reads", "computes"]] >= 0).all().all()
    assert (data.loc[data["host"].isna(), "reads"] == 0).all()
    assert np.allclose(
        data["ms"], data["copies"] * 0.51 + data["reads"] * 5.1 + data["computes"] * 0.25
    )
