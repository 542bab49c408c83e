"""Equation (1) with every timed copy, on runs built by hand: the cost-model part of Table 1,
its winner check, and `moecache choose` telling (or not) the choice from the runner-up."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from conftest import moecache
from run_records import bandwidth_record, run_record

from moecache.costs import equation
from moecache.errors import MoecacheError
from moecache.harness import decode_totals
from moecache.report import choose, tables

TAU1, TAU10 = 0.5, 5.0  # ms per copy at 1x and through the link 10x slower
TOKENS = 20  # timed tokens per sequence
SEQUENCES = 8


def run_report(run, policy, c, n, tau, multiplier=1, rho=None, noise=0.0, seed=0, delta_nll=0.0):
    """A decode results file whose every sequence costs c + n tau ms per token (times a
    noise factor, one per sequence): `n` copies per timed token, of which `rho` steady (the
    rest are fills after each sequence's first token)."""
    rho = n if rho is None else rho
    factors = 1 + noise * np.random.default_rng(seed).standard_normal(SEQUENCES)
    rows = []
    for s, factor in enumerate(factors):
        step_ms = TOKENS * (c + n * tau) * factor
        copy_ms = TOKENS * n * tau
        rows.append(
            {
                "sequence": s,
                "tokens": TOKENS + 1,
                "timed_tokens": TOKENS,
                "step_seconds": step_ms / 1e3,
                "copy_seconds": copy_ms / 1e3,
                "stall_seconds": copy_ms / 1e3,  # blocking: the compute waits for each copy
                "step_repeats": [step_ms / 1e3],
                "copy_repeats": [copy_ms / 1e3],
                "timed_copies": TOKENS * n,
                "copy_groups": TOKENS * n / 2,
                "fills": TOKENS * (n - rho) + 4,
                "steady": TOKENS * rho,
                "nll_sum": 5.0 * TOKENS,
                "scored": TOKENS,
                "nll": 5.0,
            }
        )
    totals = {**decode_totals.totals(rows), "delta_nll": delta_nll}  # as the harness totals them
    return run_record(
        run=run,
        policy=policy,
        restricts=policy in ("dwell", "static", "controller"),
        capacity=8,
        multiplier=multiplier,
        shard="a",
        sequences_decoded=list(range(SEQUENCES)),
        totals=totals,
        sequences=rows,
    )


def bandwidth_report(device_name="test GPU"):
    multipliers = {
        "1": {"tau_ms": TAU1, "group_overhead_ms": 0.02, "ratio_to_1x": 1.0},
        "10": {"tau_ms": TAU10, "group_overhead_ms": 0.03, "ratio_to_1x": TAU10 / TAU1},
    }
    return bandwidth_record(
        device_name=device_name,
        tau_ms=TAU1,
        group_overhead_ms=0.02,
        multipliers=multipliers,
        loop_gib_per_s=24.0,
        large_copy_ms=1.0,
        large_gib_per_s=40.0,
        expert_bytes=12_582_912,
        experts=64,
    )


def write(folder, report) -> str:
    path = folder / f"{report['run']}-x{report['multiplier']}.json"
    path.write_text(json.dumps(report))
    return str(path)


def priced(report):
    return equation.point(report, TAU1)


def test_every_timed_copy_reproduces_the_step_and_steady_copies_alone_do_not():
    """A run with fills after the first token: n = 3 copies per token, rho = 2 of them
    steady. Its 1x and 10x steps are c + n tau(m); equation (1) with n predicts the 10x step
    exactly, with rho it misses by (n - rho)(tau(10) - tau(1)) per token."""
    c, n, rho = 10.0, 3.0, 2.0
    one = priced(run_report("lru", "lru", c, n, TAU1, rho=rho))
    ten = equation.point(run_report("lru", "lru", c, n, TAU10, multiplier=10, rho=rho))
    assert one.ms_per_token(TAU1) == pytest.approx(one.step_ms)  # 1x: the measured step
    assert one.compute_ms == pytest.approx(c)
    (row,), _ = equation.cost_rows([one], [ten], {10: TAU10})
    assert row["predicted_ms"] == pytest.approx(c + n * TAU10) == pytest.approx(ten.step_ms)
    assert row["relative_error"] == pytest.approx(0, abs=1e-12) and row["within_5pct"]
    # Counting only the steady copies: c from the same step, rho copies at tau(10).
    steady_only = dataclasses.replace(one, copies_per_token=one.rho)
    (off,), _ = equation.cost_rows([steady_only], [ten], {10: TAU10})
    missing = (n - rho) * (TAU10 - TAU1)
    assert off["predicted_ms"] == pytest.approx(ten.step_ms - missing)
    assert abs(off["relative_error"]) > 0.05 and not off["within_5pct"]


def test_ignoring_the_multiplier_is_flagged():
    """A "10x" run whose copies were not slowed (measured at the 1x copy cost): the
    prediction at tau(10) is far off, and the table says so."""
    one = priced(run_report("lru", "lru", 10.0, 3.0, TAU1))
    not_slowed = equation.point(run_report("lru", "lru", 10.0, 3.0, TAU1, multiplier=10))
    rows, _ = equation.cost_rows([one], [not_slowed], {10: TAU10})
    (row,) = rows
    assert row["relative_error"] == pytest.approx(3.0 * (TAU10 - TAU1) / (10 + 3 * TAU1))
    assert row["relative_error"] > 0.5 and not row["within_5pct"]
    lines = equation.winner_lines(equation.winner_check(rows), rows)
    assert "Every run within 5%: no (largest error +117.4%, lru at 10x)." in lines


def test_table1_cost_model_part_and_winner_check(tmp_path):
    """Through `moecache table table1`: the cost-model rows, AGREE per multiplier, a run
    with no timed copies left out of the winner check with the reason, every run within
    5%, and a GPU check's bandwidth as another device row."""
    specs = [  # run, policy, c, n
        ("all", "all", 12.0, 0.0),  # C = N: copies only at the untimed first token
        ("lru", "lru", 10.0, 3.0),
        ("farthest-future", "farthest-future", 10.2, 1.5),
        ("dwell", "dwell", 10.1, 1.0),
    ]
    runs = [write(tmp_path, run_report(r, p, c, n, TAU1)) for r, p, c, n in specs]
    scaled = [
        write(tmp_path, run_report(r, p, c, n, TAU10, multiplier=10))
        for r, p, c, n in specs
        if r != "dwell"
    ]
    bandwidth = tmp_path / "own.json"
    bandwidth.write_text(json.dumps(bandwidth_report("own GPU")))
    check_dir = tmp_path / "gpu-check"
    check_dir.mkdir()
    gpu_check = check_dir / "h200.json"
    other = bandwidth_report("bandwidth's name")
    other["multipliers"]["50"] = {"tau_ms": 12.0, "group_overhead_ms": 0.0, "ratio_to_1x": 24.0}
    gpu_check.write_text(json.dumps({"device_name": "NVIDIA H200", "bandwidth": other}))
    # `make gpu-check`'s files: the device row from the paper-sized layer where measured.
    paper = {**bandwidth_report(), "loop_gib_per_s": 11.4, "expert_bytes": 12_582_912}
    smoke = {**bandwidth_report(), "loop_gib_per_s": 0.5, "expert_bytes": 24_576}
    l4, failed = check_dir / "l4.json", check_dir / "failed.json"
    l4.write_text(
        json.dumps(
            {
                "device_name": "NVIDIA L4",
                "device_row": "paper_layer",
                "bandwidth": smoke,
                "paper_layer": paper,
            }
        )  # fmt: skip
    )
    failed.write_text(
        json.dumps(
            {
                "device_name": "NVIDIA A10",
                "device_row": "paper_layer",
                "bandwidth": None,
                "paper_layer": None,
            }
        )  # fmt: skip
    )
    out = tmp_path / "figures"
    result = moecache(
        "table", "table1", "--runs", *runs, "--scaled", *scaled, "--bandwidth", str(bandwidth),
        "--gpu-check", str(gpu_check), str(l4), str(failed), "--out-dir", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    cost = pd.read_csv(out / "table1_cost_model.csv")
    assert list(cost["run"]) == ["all", "farthest-future", "lru"]
    for row in cost.itertuples():
        c, n = next((c, n) for r, _, c, n in specs if r == row.run)
        assert (row.n, row.c_ms, row.tau_bandwidth_ms) == pytest.approx((n, c, TAU10))
        # tau(10) = 10 tau(1), tau(1) as the 1x run timed its own copies (none: no tau).
        assert row.tau_ms == pytest.approx(TAU10) if n else pd.isna(row.tau_ms)
        assert row.predicted_ms == pytest.approx(c + n * TAU10)
        assert row.measured_ms_lo - 1e-9 <= row.measured_ms <= row.measured_ms_hi + 1e-9
        assert row.relative_error == pytest.approx(0, abs=1e-9) and row.within_5pct
    assert not cost.set_index("run").loc["all", "in_winner_check"]
    # all (12 ms) is fastest at 10x; left out, ff (17.2) beats lru (25).
    winners = cost[cost.predicted_winner & cost.measured_winner]
    assert list(winners["run"]) == ["farthest-future"]
    text = (out / "table1.md").read_text()
    assert (
        "At 10x: equation (1) predicts farthest-future, measured fastest farthest-future: AGREE."
        in text
    )
    assert "left out of the winner check, making no timed copies" in text
    assert "cannot lose): all." in text
    assert "not told apart" not in text  # identical sequences: zero-width intervals
    assert "Every run within 5%: yes" in text
    policies = pd.read_csv(out / "table1_policies.csv").set_index("run")
    assert policies.loc["lru", "copies_per_token"] == 3.0
    assert policies.loc["lru", "copy_share_pct"] == pytest.approx(100 * 1.5 / 11.5)
    lo, hi = policies.loc["lru", ["tokens_per_second_lo", "tokens_per_second_hi"]]
    assert lo - 1e-9 <= policies.loc["lru", "tokens_per_second"] <= hi + 1e-9
    devices = pd.read_csv(out / "table1_devices.csv")
    assert list(devices["device"]) == ["own GPU", "NVIDIA H200", "NVIDIA L4"]
    assert list(devices["source"]) == ["bandwidth", "gpu-check", "gpu-check (paper layer)"]
    assert devices.loc[2, "gib_per_s"] == 11.4
    assert "GPU check failed.json (NVIDIA A10) measured no bandwidth." in text
    assert devices.loc[0, "tau_ms_x10"] == TAU10 and devices.loc[0, "ratio_x10"] == 10
    assert devices.loc[1, "ratio_x50"] == 24 and pd.isna(devices.loc[0, "ratio_x50"])
    sources = json.loads((out / "table1.sources.json").read_text())
    assert any(e["path"].endswith("h200.json") for e in sources["inputs"])


def test_an_overlapping_measured_winner_is_not_told_apart():
    rows = [
        {"multiplier": 10, "run": "a", "n": 1.0, "predicted_ms": 10.0, "measured_ms": 10.0,
         "measured_ms_lo": 9.0, "measured_ms_hi": 11.0},
        {"multiplier": 10, "run": "b", "n": 2.0, "predicted_ms": 11.0, "measured_ms": 10.5,
         "measured_ms_lo": 10.2, "measured_ms_hi": 11.5},
    ]  # fmt: skip
    (check,) = equation.winner_check(rows)
    assert check["agree"] and not check["told_apart"]
    rows[1]["measured_ms_lo"] = 11.1
    (check,) = equation.winner_check(rows)
    assert check["told_apart"]


def test_a_multiplier_the_bandwidth_file_did_not_measure_is_refused(tmp_path):
    runs = [write(tmp_path, run_report("lru", "lru", 10.0, 3.0, TAU1))]
    scaled = [write(tmp_path, run_report("lru", "lru", 10.0, 3.0, 5.0, multiplier=50))]
    bandwidth = tmp_path / "own.json"
    bandwidth.write_text(json.dumps(bandwidth_report()))
    with pytest.raises(Exception, match="no copy time measured at 50x"):
        tables.table1(runs, scaled, [bandwidth])


def run_choose(tmp_path, *reports, multiplier=10):
    paths = [write(tmp_path, r) for r in reports]
    bandwidth = tmp_path / "own.json"
    bandwidth.write_text(json.dumps(bandwidth_report()))
    args = ["choose", "--runs", *paths, "--bandwidth", str(bandwidth), "--max-loss", "0"]
    result = moecache(*args, "--multiplier", str(multiplier))
    assert result.returncode == 0, result.stderr
    return result.stdout, json.loads(
        moecache(*args, "--multiplier", str(multiplier), "--json").stdout
    )


def test_choose_says_when_the_choice_is_not_told_apart(tmp_path):
    """Two runs 1% apart at 10x whose sequences vary by 10% independently: the paired
    interval of their difference holds 0, and the summary says so in one line."""
    a = run_report("ff", "farthest-future", 10.0, 1.0, TAU1, noise=0.1, seed=1)
    b = run_report("lru", "lru", 10.05, 1.0, TAU1, noise=0.1, seed=2)
    text, report = run_choose(tmp_path, a, b)
    first, second = report["choice"], report["runner_up"]["b"]
    assert {first, second} == {"ff", "lru"}
    lo, hi = report["runner_up"]["interval"]
    assert lo < 0 < hi and report["runner_up"]["told_apart"] is False
    lines = [line for line in text.splitlines() if line.startswith("cannot tell")]
    assert len(lines) == 1
    assert lines[0].startswith(f"cannot tell {first} from {second} at the measured noise")
    assert "ms/token, 95% interval" in lines[0]
    # The point difference is the difference of the predicted ms/token.
    predicted = {p["run"]: p["predicted_ms"] for p in report["policies"]}
    assert report["runner_up"]["difference_ms"] == pytest.approx(
        predicted[first] - predicted[second]
    )


def test_choose_says_nothing_when_the_choice_is_clearly_faster(tmp_path):
    """Noisy sequences, but ff copies a third as many experts: at 10x it is clearly faster."""
    a = run_report("ff", "farthest-future", 10.0, 1.0, TAU1, noise=0.05, seed=1)
    b = run_report("lru", "lru", 10.0, 3.0, TAU1, noise=0.05, seed=2)
    text, report = run_choose(tmp_path, a, b)
    assert report["choice"] == "ff" and report["runner_up"]["told_apart"]
    hi = report["runner_up"]["interval"][1]
    assert hi < 0
    assert "cannot tell" not in text


def test_choose_never_picks_the_all_resident_run_unless_asked(tmp_path):
    """The all-resident run copies nothing after the first token, so it is always the
    fastest; it is the baseline offloading avoids, shown but not chosen by default."""
    runs = [
        run_report("all", "all", 10.0, 0.0, TAU1),
        run_report("ff", "farthest-future", 10.0, 1.0, TAU1),
        run_report("lru", "lru", 10.0, 3.0, TAU1),
    ]
    points = [priced(r) for r in runs]
    report = choose.choose_report(points, TAU10, 0.0)
    assert report["choice"] == "ff" == choose.choose(points, TAU10, 0.0).run
    rows = {row["run"]: row for row in report["policies"]}
    assert not rows["all"]["candidate"] and rows["ff"]["candidate"]
    assert all("all" not in (c["a"], c["b"]) for c in report["crossovers"])
    assert "all-resident baseline, not a candidate" in "\n".join(choose.choose_summary(report))
    assert choose.choose_report(points, TAU10, 0.0, include_baseline=True)["choice"] == "all"
    with pytest.raises(MoecacheError, match="only the all-resident run"):
        choose.choose(points[:1], TAU10, 0.0)


def test_a_negative_compute_time_is_refused_naming_the_run_and_tau(tmp_path):
    """lru's step is 10 + 3 x 0.5 ms: priced at tau(1) = 5 ms, c = 11.5 - 15 < 0."""
    paths = [
        write(tmp_path, run_report(run, policy, 10.0, n, TAU1))
        for run, policy, n in (("ff", "farthest-future", 0.2), ("lru", "lru", 3))
    ]
    result = moecache("choose", "--runs", *paths, "--tau-ms", "5", "--max-loss", "0")
    assert result.returncode == 2 and not result.stdout
    (line,) = result.stderr.strip().splitlines()
    assert "run lru: compute time" in line and "negative" in line and "tau(1) = 5 ms" in line
    with pytest.raises(MoecacheError, match="run lru: .* negative .* at tau\\(1\\) = 5 ms"):
        choose.choose([equation.point(run_report("lru", "lru", 10.0, 3, TAU1), 5.0)], 5, 0)


def test_a_tau_given_without_a_bandwidth_file_says_what_it_assumes(tmp_path):
    paths = [write(tmp_path, run_report("lru", "lru", 10.0, 3.0, TAU1))]
    given = moecache("choose", "--runs", *paths, "--tau-ms", str(TAU1), "--max-loss", "0")
    assert given.returncode == 0, given.stderr
    assumed = [line for line in given.stdout.splitlines() if line.startswith("assumes")]
    assert assumed == [
        "assumes tau(1) = 0.5 ms per copy on this machine (--tau-ms; no --bandwidth measured "
        "it): each run's c = step - n x tau(1)"
    ]
    text, report = run_choose(tmp_path, run_report("lru", "lru", 10.0, 3.0, TAU1))
    assert report["tau1_assumed"] is False and "assumes" not in text


def test_paired_difference_resamples_sequences_together():
    """Sequences that are slow for both runs cancel in a paired difference."""
    rng = np.random.default_rng(0)
    shared = rng.uniform(5, 15, 30)  # a per-sequence cost both runs pay
    tokens = np.full(30, 10.0)
    a, b = tokens * shared, tokens * (shared + 0.1)
    diff, (lo, hi) = equation.paired_difference(a, tokens, b, tokens, seed=3)
    assert diff == pytest.approx(-0.1) and lo == pytest.approx(-0.1) and hi == pytest.approx(-0.1)
    # The same pair unpaired (b's sequences shuffled): the interval widens past 0.
    _, (lo, hi) = equation.paired_difference(a, tokens, rng.permutation(b), tokens, seed=3)
    assert lo < 0 < hi
    with pytest.raises(Exception, match="same sequences"):
        equation.paired_difference(a, tokens, b[:-1], tokens[:-1])


def test_predicted_interval_at_1x_is_the_measured_step_interval():
    run = priced(run_report("lru", "lru", 10.0, 3.0, TAU1, noise=0.1))
    assert run.predicted_interval(TAU1) == pytest.approx(list(run.step_ms_ci))


def test_fig1_draws_intervals_in_every_panel(tmp_path):
    """An error bar on every point: the 1x points, the predictions at 10x and the run
    measured at 10x."""
    from matplotlib.container import ErrorbarContainer

    from moecache.report import figures

    runs = [
        write(tmp_path, run_report("lru", "lru", 10.0, 3.0, TAU1, noise=0.05)),
        write(tmp_path, run_report("dwell", "dwell", 10.0, 1.0, TAU1, noise=0.05, delta_nll=0.1)),
    ]
    scaled = [write(tmp_path, run_report("lru", "lru", 10.0, 3.0, TAU10, multiplier=10))]
    bandwidth = tmp_path / "own.json"
    bandwidth.write_text(json.dumps(bandwidth_report()))
    fig, _ = figures.fig1(runs, scaled, [bandwidth])
    one, ten = fig.axes[:2]
    bars = [[c for c in ax.containers if isinstance(c, ErrorbarContainer)] for ax in (one, ten)]
    assert len(bars[0]) == 2 and len(bars[1]) == 3
    for container in bars[0] + bars[1]:
        (segments,) = container.lines[2]
        assert len(segments.get_segments()) == 1
    out = tmp_path / "figures"
    result = moecache(
        "figure", "fig1", "--runs", *runs, "--scaled", *scaled, "--bandwidth", str(bandwidth),
        "--out-dir", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (out / "fig1.png").read_bytes()[:4] == b"\x89PNG"


def test_a_scaled_run_on_the_first_sequences_is_predicted_from_the_same_ones():
    """A run at 10x that decoded the first half of the sequences is predicted from the 1x
    run's numbers on that half, not on all of them."""
    report = run_report("lru", "lru", 10.0, 3.0, TAU1)
    for row in report["sequences"][: SEQUENCES // 2]:  # the first half copy twice as much
        row["timed_copies"] *= 2
        row["step_seconds"] += TOKENS * 3.0 * TAU1 / 1e3
        row["copy_seconds"] += TOKENS * 3.0 * TAU1 / 1e3
    one = priced(report)
    ten_report = run_report("lru", "lru", 10.0, 6.0, TAU10, multiplier=10)
    ten_report["sequences"] = ten_report["sequences"][: SEQUENCES // 2]
    ten = equation.point(ten_report)
    (row,), _ = equation.cost_rows([one], [ten], {10: TAU10})
    assert row["n"] == pytest.approx(6.0)
    assert row["predicted_ms"] == pytest.approx(10.0 + 6.0 * TAU10)


def overlapped_report(run, policy, c, n, window):
    """An overlapped 1x run whose every copy is a used prefetch, tau(1) each, under a window
    of `window` ms per token outside the MoE blocks."""
    report = run_report(run, policy, c, 0.0, TAU1)
    for row in report["sequences"]:
        busy = TOKENS * n * TAU1 / 1e3
        row.update(
            demand_copies=0, prefetch_copies=TOKENS * n, prefetch_used=TOKENS * n,
            prefetch_wasted=0, stall_seconds=0.0, hidden_copy_seconds=busy,
            block_seconds=row["step_seconds"] - TOKENS * window / 1e3,
        )  # fmt: skip
    report["totals"]["prefetch_accuracy"] = 1.0
    return {**report, "overlap": True, "prefetch": "oracle"}


def test_choose_ranks_overlapped_runs_by_the_overlap_model_only_when_asked(tmp_path):
    """LRU blocking at 10x costs c + n tau(10); its overlapped twin prefetches every copy
    under a 4 ms window: c + max(0, n tau(10) - 4), the choice with --overlap."""
    blocking = run_report("lru", "lru", 10.0, 2.0, TAU1)
    overlapped = overlapped_report("lru-overlap", "lru", 10.0, 2.0, window=4.0)
    paths = [write(tmp_path, r) for r in (blocking, overlapped)]
    args = ["choose", "--runs", *paths, "--tau-ms", str(TAU1), "--max-loss", "0"]
    refused = moecache(*args, "--multiplier", "10")
    assert refused.returncode != 0 and "--overlap ranks it" in refused.stderr
    result = moecache(*args, "--multiplier", "10", "--overlap", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    predicted = {p["run"]: p["predicted_ms"] for p in report["policies"]}
    assert predicted["lru"] == pytest.approx(10.0 + 2.0 * TAU10)
    assert predicted["lru-overlap"] == pytest.approx(10.0 + 2.0 * TAU10 - 4.0)
    assert report["choice"] == "lru-overlap"
    assert all(c["a"] != "lru-overlap" and c["b"] != "lru-overlap" for c in report["crossovers"])
