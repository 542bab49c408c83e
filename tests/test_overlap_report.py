"""Issue 28's answer from constructed results files: the overlap figure writes its files,
the numbers section's verdict on farthest-future's advantage over LRU says yes and no as
the intervals say, names a missing run, and the section says it was not produced when no
run overlaps. The overlap cost model is faked: the section only reports its answers."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from run_records import run_record

from moecache.costs import overlap
from moecache.errors import MoecacheError
from moecache.report import figures, figures_overlap
from moecache.report.numbers import overlap as section


def report(run: str, policy: str, multiplier: int, ms: float, spread=0.1, **overlap) -> dict:
    """A decode results file's fields the report reads; overlapped when `overlap` is given
    (its prefetcher and counts)."""
    totals = {
        "step_ms": ms,
        "step_ms_ci": [ms - spread, ms + spread],
        "delta_nll": 0.0,
        "copies_per_token": 2.0,
        "timed_tokens": 100,
    }
    found = {"overlap": False, "prefetch": None}
    if overlap:
        found = {"overlap": True, "prefetch": overlap.pop("prefetch", "pregate")}
        totals |= {
            "stall_ms": 0.4,
            "hidden_copy_ms": 1.2,
            "demand_copies": 150,
            "prefetch_copies": 80,
            "prefetch_used": 60,
            "prefetch_wasted": 20,
            "prefetch_accuracy": 0.75,
            **overlap,
        }
    return run_record(
        run=run, policy=policy, multiplier=multiplier, shard="a", totals=totals, **found
    )


def write_runs(folder: Path, reports: list[dict]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in reports:
        path = folder / f"{r['run']}-x{r['multiplier']}.json"
        path.write_text(json.dumps(r))
        paths.append(path)
    return paths


def scenario(ff_overlapped_ms: float) -> list[dict]:
    """LRU and farthest-future, blocking and overlapped (pregate), at 1x and 10x: the
    overlapped farthest-future run at `ff_overlapped_ms` at 10x, LRU's at 6.0 (+-0.1)."""
    return [
        report("lru", "lru", 1, 7.0),
        report("lru", "lru", 10, 9.0),
        report("farthest-future", "farthest-future", 1, 6.5),
        report("farthest-future", "farthest-future", 10, 8.0),
        report("lru-pregate", "lru", 1, 5.5, overlap=True),
        report("lru-pregate", "lru", 10, 6.0, overlap=True),
        report("ff-pregate", "farthest-future", 1, 5.4, overlap=True),
        report("ff-pregate", "farthest-future", 10, ff_overlapped_ms, overlap=True),
    ]


@pytest.fixture
def fake_model(monkeypatch):
    """The overlap cost model's answers, whether or not the module is installed."""
    fake = types.ModuleType("moecache.costs.overlap")
    fake.stops_mattering = lambda reports: {
        "ratio": 0.42, "tau_ms": 0.1, "share": 0.05, "lru": "lru-o", "ff": "ff-o"
    }  # fmt: skip
    errors = (0.03, -0.08, 0.12, 0.01)  # the third overlapped run is off by 12%
    fake.model_rows = lambda reports, strict=True: [
        {
            "run": r["run"],
            "multiplier": r["multiplier"],
            "relative_error": errors[i % len(errors)],
            "within_10pct": abs(errors[i % len(errors)]) < 0.1,
            "compute_ratio_to_1x": 1 + errors[i % len(errors)] / 4,
        }
        for i, r in enumerate(r for r in reports if r["overlap"])
    ]
    fake.prefetch_pair = overlap.prefetch_pair  # not faked: how runs are paired
    monkeypatch.setattr(section, "overlap", fake)
    return fake


def overlap_text(tmp_path: Path, reports: list[dict]) -> str:
    write_runs(tmp_path / "results/runs/a", reports)
    return section.overlap_section(tmp_path, "a")


def test_the_advantage_survives_when_the_intervals_are_apart(tmp_path, fake_model):
    text = overlap_text(tmp_path, scenario(ff_overlapped_ms=5.0))
    assert (
        "- farthest-future's advantage over LRU survives overlap at 10x: yes (ff-pregate "
        "5.00 (4.90-5.10) ms/token against lru-pregate 6.00 (5.90-6.10): 16.7% saved)."
    ) in text
    # At 1x the intervals (5.3-5.5 and 5.4-5.6) overlap.
    assert "survives overlap at 1x: no (ff-pregate 5.40 (5.30-5.50)" in text


def test_the_advantage_does_not_survive_when_the_intervals_overlap(tmp_path, fake_model):
    verdict = section.advantage(scenario(ff_overlapped_ms=5.85), 10)
    assert verdict["survives"] is False
    assert verdict["saving"] == pytest.approx(0.025)
    assert section.advantage(scenario(ff_overlapped_ms=5.85), 1)["survives"] is False
    assert section.advantage(scenario(ff_overlapped_ms=5.5), 10)["survives"] is True


def test_the_advantage_pairs_runs_of_the_same_prefetcher(fake_model):
    reports = [
        *scenario(ff_overlapped_ms=5.0),
        report("ff-oracle", "farthest-future", 10, 3.0, overlap=True, prefetch="oracle"),
    ]
    verdict = section.advantage(reports, 10)
    assert (verdict["oracle"]["run"], verdict["baseline"]["run"]) == ("ff-pregate", "lru-pregate")


def test_a_missing_run_is_named_not_judged(tmp_path, fake_model):
    reports = [r for r in scenario(5.0) if not (r["run"] == "ff-pregate" and r["multiplier"] == 10)]
    text = overlap_text(tmp_path, reports)
    assert (
        "- farthest-future's advantage over LRU survives overlap at 10x: not measured "
        "(no overlapped farthest-future run at that multiplier)."
    ) in text
    assert "survives overlap at 1x: no" in text


def test_the_section_tables_and_the_models_verdicts(tmp_path, fake_model):
    text = overlap_text(tmp_path, scenario(ff_overlapped_ms=5.0))
    assert "| 10x: overlapped run | prefetch | blocking ms/token (95%) |" in text
    row = "| lru-pregate | pregate | lru: 9.00 (8.90-9.10) | 6.00 (5.90-6.10) | 0.40 | 1.20 |"
    assert row + " 75.0% | 25.0% |" in text
    assert "stops mattering below a copy-to-compute ratio of 0.42" in text
    # The fake model puts the third overlapped run 12% off.
    assert (
        "- Every overlapped run within 10% of the overlap cost model: no (largest error +12.0%"
        in text
    )
    # Of the runs above 1x (ff-pregate, lru-pregate at 10x), the compute moved -2% and +0.25%.
    assert "against the 1x twin's): -2.0% to +0.2% (largest ff-pregate at 10x)" in text
    fake_model.stops_mattering = lambda reports: None
    fake_model.model_rows = lambda reports, strict=True: [
        {"run": "x", "multiplier": 1, "relative_error": -0.04, "within_10pct": True}
    ]
    text = overlap_text(tmp_path, scenario(ff_overlapped_ms=5.0))
    assert "cannot say at which copy-to-compute ratio" in text
    assert "The compute beside a slowed copy worker: no overlapped run above 1x." in text
    assert "cost model: yes (largest error -4.0%, x at 1x)." in text


def test_no_overlapped_run_is_not_produced(tmp_path):
    blocking = [r for r in scenario(5.0) if not r["overlap"]]
    assert overlap_text(tmp_path, blocking).startswith("Not produced by this run")


def test_the_figure_writes_its_files_from_results_files(tmp_path):
    paths = write_runs(tmp_path / "results/runs/a", scenario(ff_overlapped_ms=5.0))
    runs = [p for p in paths if p.name.endswith("-x1.json")]
    scaled = [p for p in paths if p not in runs]
    build, reads = figures.BUILDERS["fig_overlap"]
    assert reads == ("runs", "scaled")
    fig, sources = build(runs, scaled)
    speed, stall = fig.axes
    dashed = [line for line in speed.get_lines() if line.get_linestyle() == "--"]
    solid = [line for line in speed.get_lines() if line.get_linestyle() == "-"]
    assert len(dashed) == 2 and len(solid) == 2  # overlapped and blocking, per policy
    assert {tuple(line.get_xdata()) for line in dashed} == {(1, 10)}
    # One colour per policy: each overlapped line has its blocking twin's.
    colors = {line.get_color() for line in dashed}
    assert len(colors) == 2 and colors == {line.get_color() for line in solid}
    assert len(stall.get_lines()) == 4  # stall and hidden copy time per overlapped run
    figures.write("fig_overlap", fig, sources, tmp_path / "figures")
    for suffix in ("pdf", "png", "sources.json"):
        assert (tmp_path / f"figures/fig_overlap.{suffix}").stat().st_size > 0
    recorded = json.loads((tmp_path / "figures/fig_overlap.sources.json").read_text())
    assert len(recorded["inputs"]) == len(paths)


def test_the_figure_refuses_results_without_an_overlapped_run(tmp_path):
    paths = write_runs(tmp_path, [r for r in scenario(5.0) if not r["overlap"]])
    with pytest.raises(MoecacheError, match="no overlapped run"):
        figures_overlap.fig_overlap(paths, [])
