"""The cost model, the policy chooser, and the paper's tables and figures.

Table cells are recomputed here from the raw per-sequence rows of the run files, not copied
from the totals the tables read, so a wrong column or a stale input fails.
"""

from __future__ import annotations

import hashlib
import json

import pandas as pd
import pytest
from conftest import SMOKE, load_yaml, moecache, snakemake
from run_records import bandwidth_record, run_record, sequence_row, sweep_record

from moecache.costs import equation
from moecache.errors import MoecacheError
from moecache.records.bandwidth import BandwidthResult
from moecache.records.io import read_dict
from moecache.report import choose

# --- the cost model and `moecache choose` on a constructed example ------------------------


TAU = 0.1  # this machine's copy time at 1x, as the example's bandwidth file has it


def write_run(folder, run, policy, delta_nll, compute_ms, n, multiplier=1, sequences=4):
    """A decode results file whose every sequence costs c + n tau per timed token (c =
    `compute_ms`, tau = TAU): the totals and per-sequence rows the cost model reads."""
    path = folder / f"{run}-x{multiplier}.json"
    step_ms = compute_ms + n * TAU
    rows = [
        sequence_row(sequence=s, timed_tokens=10, step_seconds=10 * step_ms / 1e3,
                     timed_copies=10 * n, copy_seconds=10 * n * TAU / 1e3)
        for s in range(sequences)
    ]  # fmt: skip
    totals = {
        "delta_nll": delta_nll,
        "step_ms": step_ms,
        "step_ms_ci": [step_ms, step_ms],
        "tokens_per_second": 1e3 / step_ms,
        "tokens_per_second_ci": [1e3 / step_ms, 1e3 / step_ms],
        "rho": n,
        "copies_per_token": n,
        "copy_share": n * TAU / step_ms,
        "compute_ms": compute_ms,
        "compute_ms_ci": [compute_ms, compute_ms],
    }
    record = run_record(
        run=run,
        policy=policy,
        restricts=policy == "dwell",
        multiplier=multiplier,
        shard="a",
        sequences_decoded=list(range(sequences)),
        totals=totals,
        sequences=rows,
    )
    path.write_text(json.dumps(record))
    return path


@pytest.fixture
def example(tmp_path):
    """Three lossless-or-not points whose ranking flips with the copy time:
    lru: c 10, n 10; ff: c 11, n 5 (lossless); dwell: c 10.5, n 1, loss 0.07."""
    runs = [
        write_run(tmp_path, "lru", "lru", 0.0, 10.0, 10.0),
        write_run(tmp_path, "ff", "farthest-future", 0.0, 11.0, 5.0),
        write_run(tmp_path, "dwell", "dwell", 0.07, 10.5, 1.0),
    ]
    bandwidth = tmp_path / "bandwidth.json"
    bandwidth.write_text(json.dumps(bandwidth_record(tau_ms=TAU, multipliers={})))
    return runs, bandwidth


@pytest.mark.parametrize(
    "multiplier, max_loss, expected",
    [
        (1, 0.0, "lru"),  # tau 0.1: 11 vs 11.5: copies cheap, lru wins
        (5, 0.0, "ff"),  # tau 0.5: 15 vs 13.5
        (5, 0.1, "dwell"),  # 11 beats both once its loss is allowed
        (0.1, 0.1, "lru"),  # tau 0.01: 10.1 vs 10.51 vs 11.05
    ],
)
def test_choose_picks_the_least_predicted_time_within_the_limit(
    example, multiplier, max_loss, expected
):
    runs, _ = example
    result = moecache(
        "choose",
        "--runs",
        *map(str, runs),
        "--tau-ms",
        str(TAU),
        "--multiplier",
        str(multiplier),
        "--max-loss",
        str(max_loss),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["choice"] == expected
    tau = TAU * multiplier
    assert report["tau_ms"] == pytest.approx(tau)
    # The brute-force answer: every admissible policy's c + n * tau, c = step - n tau(1).
    allowed = [p for p in report["policies"] if p["delta_nll"] <= max_loss]
    assert min(allowed, key=lambda p: p["compute_ms"] + p["copies_per_token"] * tau)["run"] == (
        expected
    )
    for p in report["policies"]:
        assert p["compute_ms"] == pytest.approx(p["step_ms"] - p["copies_per_token"] * TAU)
        assert p["predicted_ms"] == pytest.approx(p["compute_ms"] + p["copies_per_token"] * tau)
    # Every sequence costs the same: the choice is told apart from the runner-up.
    assert report["runner_up"]["told_apart"]


def test_choose_reads_tau_from_bandwidth_and_scales_it(example):
    runs, bandwidth = example
    args = ["choose", "--runs", *map(str, runs), "--bandwidth", str(bandwidth), "--max-loss", "0"]
    assert json.loads(moecache(*args, "--json").stdout)["choice"] == "lru"  # tau 0.1
    scaled = json.loads(moecache(*args, "--multiplier", "5", "--json").stdout)
    assert scaled["tau_ms"] == pytest.approx(0.5) and scaled["choice"] == "ff"
    assert "fastest within Delta NLL 0" in moecache(*args).stdout


def test_crossovers_are_where_lines_meet(example):
    runs, _ = example
    points = equation.read_points(runs, TAU)
    lru, ff, dwell = points
    assert choose.crossover(lru, ff) == pytest.approx(0.2)  # 10 + 10t = 11 + 5t
    assert choose.crossover(lru, dwell) == pytest.approx(0.5 / 9)
    assert choose.crossover(lru, lru) is None
    found = {(c["a"], c["b"]): c["tau_ms"] for c in choose.crossovers(points)}
    assert found[("lru", "ff")] == pytest.approx(0.2)
    # ff and dwell: 11 + 5t = 10.5 + t at t = -0.125: no crossing at a positive copy time.
    assert ("ff", "dwell") not in found


def test_choose_refuses_bad_input(example, tmp_path):
    runs, _ = example
    scaled = write_run(tmp_path, "lru", "lru", 0.0, 10.0, 10.0, multiplier=10)
    for args, message in [
        (
            ["--runs", *map(str, runs), "--max-loss", "-1", "--tau-ms", "1"],
            "no policy is admissible",
        ),
        (["--runs", str(scaled), "--max-loss", "0", "--tau-ms", "1"], "reads 1x runs"),
        (["--runs", *map(str, runs), "--max-loss", "0"], "--bandwidth"),
        (["--runs", str(tmp_path / "missing.json"), "--max-loss", "0", "--tau-ms", "1"], "missing"),
    ]:
        result = moecache("choose", *args)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_winner_check_compares_prediction_with_measurement(example, tmp_path):
    runs, _ = example
    points = equation.read_points(runs, TAU)
    scaled = [
        write_run(tmp_path, "lru", "lru", 0.0, 30.0 - 10 * TAU, 10.0, multiplier=10),
        write_run(tmp_path, "ff", "farthest-future", 0.0, 20.0 - 5 * TAU, 5.0, multiplier=10),
        write_run(tmp_path, "lru", "lru", 0.0, 9.0 - 10 * TAU, 10.0, multiplier=50),
    ]
    measured = [equation.point(json.loads(path.read_text())) for path in scaled]
    rows, orphans = equation.cost_rows(points, measured, {10: 0.5, 50: 2.5})
    assert not orphans and [r["run"] for r in rows] == ["ff", "lru", "lru"]
    checks = equation.winner_check(rows)
    assert [c["multiplier"] for c in checks] == [10, 50]
    row, alone = checks
    assert alone["agree"] is None  # one run alone at 50x decides nothing
    assert row["predicted_winner"] == "ff" and row["measured_winner"] == "ff" and row["agree"]
    lru = next(r for r in rows if r["run"] == "lru" and r["multiplier"] == 10)
    # From its own 1x run: c = 10, n = 10, tau(10) = 10 x the 1x run's own tau (TAU).
    assert lru["predicted_ms"] == pytest.approx(10 + 10 * 10 * TAU)
    assert lru["tau_bandwidth_ms"] == 0.5
    assert lru["relative_error"] == pytest.approx(20 / 30 - 1) and not lru["within_5pct"]


def test_an_unknown_table_is_one_line(tmp_path):
    result = moecache("table", "table9", "--out-dir", str(tmp_path))
    assert result.returncode == 2 and "unknown name 'table9'" in result.stderr


# --- the tables and figures of the smoke run, against their run files --------------------


def recomputed(run: dict) -> dict:
    """A run's Table 1 numbers from its per-sequence rows."""
    rows = run["sequences"]
    timed = sum(r["timed_tokens"] for r in rows)
    steps = sum(r["step_seconds"] for r in rows)
    copy_s = sum(r["copy_seconds"] for r in rows)
    nll = sum(r["nll_sum"] for r in rows) / sum(r["scored"] for r in rows)
    return {
        "delta_nll": nll - run["base_nll"],
        "tokens_per_second": timed / steps,
        "rho": sum(r["steady"] for r in rows) / timed,
        "copies_per_token": sum(r["timed_copies"] for r in rows) / timed,
        "tau_ms": 1e3 * copy_s / max(sum(r["timed_copies"] for r in rows), 1),
        "copy_share_pct": 100 * copy_s / steps,
        "compute_ms": 1e3 * (steps - copy_s) / timed,
        "step_ms": 1e3 * steps / timed,
    }


def runs_of(workdir, shard, multiplier=1):
    return {
        path.stem.rsplit("-x", 1)[0]: json.loads(path.read_text())
        for path in sorted((workdir / "results/runs" / shard).glob(f"*-x{multiplier}.json"))
    }


def test_table1_cells_equal_their_run_files(smoke_run):
    figures = smoke_run / "figures"
    policies = pd.read_csv(figures / "table1_policies.csv")
    runs = runs_of(smoke_run, "a")
    assert sorted(policies["run"]) == sorted(runs)
    for row in policies.itertuples():
        expected = recomputed(runs[row.run])
        for column in (
            "delta_nll",
            "tokens_per_second",
            "rho",
            "copies_per_token",
            "copy_share_pct",
            "compute_ms",
        ):
            assert getattr(row, column) == pytest.approx(expected[column], rel=1e-9, abs=1e-12)
        low, high = runs[row.run]["totals"]["tokens_per_second_ci"]
        assert (row.tokens_per_second_lo, row.tokens_per_second_hi) == pytest.approx((low, high))
        assert row.copies_per_token >= row.rho  # fills after the first token count too
        restricting = ("dwell", "static", "controller")
        assert row.routing == ("restricted" if row.policy in restricting else "preserved")
    devices = pd.read_csv(figures / "table1_devices.csv")
    bandwidth = read_dict(smoke_run / "results/bandwidth/cpu.json", BandwidthResult)
    assert devices.loc[0, "tau_ms"] == pytest.approx(bandwidth["multipliers"]["1"]["tau_ms"])
    assert devices.loc[0, "gib_per_s"] == pytest.approx(bandwidth["loop_gib_per_s"])
    assert devices.loc[0, "group_overhead_ms"] == pytest.approx(bandwidth["group_overhead_ms"])
    assert devices.loc[0, "ratio_x10"] == pytest.approx(
        bandwidth["multipliers"]["10"]["ratio_to_1x"]
    )
    cost = pd.read_csv(figures / "table1_cost_model.csv")
    tau1 = bandwidth["multipliers"]["1"]["tau_ms"]
    assert set(cost["multiplier"]) == {10}  # smoke runs lru and dwell-4 at 10x
    for row in cost.itertuples():
        scaled = runs_of(smoke_run, "a", row.multiplier)[row.run]
        # Predicted from its 1x twin, decoded token by token beside it: tau(m) = m tau(1)
        # as the twin timed its own copies.
        twin = scaled["twin_1x"]["sequences"]
        timed = sum(r["timed_tokens"] for r in twin)
        copies = sum(r["timed_copies"] for r in twin)
        n, tau1 = copies / timed, 1e3 * sum(r["copy_seconds"] for r in twin) / copies
        c = 1e3 * sum(r["step_seconds"] for r in twin) / timed - n * tau1
        assert (row.n, row.c_ms, row.tau_ms) == pytest.approx((n, c, row.multiplier * tau1))
        assert row.predicted_ms == pytest.approx(c + n * row.multiplier * tau1)
        bandwidth_tau = bandwidth["multipliers"][str(row.multiplier)]["tau_ms"]
        assert row.tau_bandwidth_ms == pytest.approx(bandwidth_tau) and tau1 > 0
        measured = recomputed(scaled)["step_ms"]
        assert row.measured_ms == pytest.approx(measured)
        assert [row.measured_ms_lo, row.measured_ms_hi] == pytest.approx(
            scaled["totals"]["step_ms_ci"]
        )
        assert row.relative_error == pytest.approx(row.predicted_ms / measured - 1)
        assert row.within_5pct == (abs(row.relative_error) <= 0.05)
    text = (figures / "table1.md").read_text()
    for m, group in cost.groupby("multiplier"):
        contest = group[group.n > 0]
        assert list(contest["run"]) == list(group.loc[group.in_winner_check, "run"])
        predicted = contest.loc[contest["predicted_ms"].idxmin(), "run"]
        measured = contest.loc[contest["measured_ms"].idxmin(), "run"]
        assert group.loc[group.predicted_winner, "run"].item() == predicted
        assert group.loc[group.measured_winner, "run"].item() == measured
        verdict = "AGREE" if predicted == measured else "DISAGREE"
        assert (
            f"At {m}x: equation (1) predicts {predicted}, measured fastest {measured}: "
            f"{verdict}." in text
        )
    worst = cost.loc[cost["relative_error"].abs().idxmax()]
    every = "yes" if cost["within_5pct"].all() else "no"
    assert f"Every run within 5%: {every} (largest error {100 * worst.relative_error:+.1f}%" in text


def replay_result(smoke_run, name: str, trace: str, capacity: int) -> dict:
    """A row's replay, bound or foresight file: the one of its shard at its capacity."""
    from moecache.report import replayed

    found = {c: path for _, c, path in replayed.found(smoke_run, name, [trace])}
    return json.loads(found[capacity].read_text())


def test_replay_tables_equal_their_results(smoke_run):
    figures, results = smoke_run / "figures", smoke_run / "results/replay"
    eviction = pd.read_csv(figures / "table_eviction.csv")
    # Every replayed capacity has its rows (the smoke config adds one to the harness's).
    assert eviction["capacity"].nunique() == 2
    for row in eviction.itertuples():
        replayed = replay_result(smoke_run, "replay", row.trace, row.capacity)["rules"]
        per_stream = sum(s["after_fill"] for s in replayed[row.rule]["streams"])
        assert row.after_fill == per_stream
        lru = sum(s["after_fill"] for s in replayed["lru"]["streams"])
        oracle = sum(s["after_fill"] for s in replayed["farthest-future"]["streams"])
        assert row.gap_recovered == pytest.approx((lru - per_stream) / (lru - oracle))
    bounds = pd.read_csv(figures / "table_bounds.csv")
    all_optimal = True
    for row in bounds.itertuples():
        report = replay_result(smoke_run, "bound", row.trace, row.capacity)
        streams = report["streams"]
        flat, greedy = sum(s["b_flat"] for s in streams), sum(s["b_greedy"] for s in streams)
        best = sum(s["b_star"] for s in streams)
        assert (row.b_flat, row.b_star, row.b_greedy) == (flat, best, greedy)
        assert row.greedy_minus_b_star == greedy - best and row.integral
        assert row.greedy_optimal_share == pytest.approx(
            sum(s["b_star"] == s["b_greedy"] for s in streams) / len(streams)
        )
        all_optimal &= all(s["b_star"] == s["b_greedy"] for s in streams)
        assert row.gap == pytest.approx((greedy - flat) / flat)
        assert row.coincide_share == pytest.approx(
            sum(s["b_flat"] == s["b_greedy"] for s in streams) / len(streams)
        )
    text = (figures / "table_bounds.md").read_text()
    assert ("equals B* on every stream of every shard" in text) == all_optimal
    sweep = pd.read_csv(figures / "table_bounds_sweep.csv")
    found = json.loads((results / "optimum-sweep.json").read_text())
    assert sweep.loc[0, "greedy_not_optimal"] == len(found["not_optimal_instances"])
    assert sweep.loc[0, "instances"] == sum(c["instances"] for c in found["cells"])
    assert sweep.loc[0, "lp_dp_disagreements"] == 0
    # The non-unit-cost experiment: its own part and caption, recomputed from the streams.
    mixed = pd.read_csv(figures / "table_bounds_mixed_precision.csv")
    assert sorted(mixed["trace"]) == sorted(bounds["trace"])
    assert "**mixed precision**" in text and "Where the optimum stops being greedy" in text
    for row in mixed.itertuples():
        report = replay_result(smoke_run, "bound", row.trace, row.capacity)
        streams = report["mixed_precision"]
        lp_cost = sum(s["lp"] for s in streams["streams"])
        ff = sum(s["farthest_future"] for s in streams["streams"])
        assert (row.lp, row.farthest_future) == pytest.approx((lp_cost, ff))
        assert row.lp <= min(row.farthest_future, row.cheapest) and row.integral


def test_bounds_table_from_demand_files(tmp_path):
    """B*, greedy's distance to it, the verdict and the mixed-precision part with its own
    caption, from `moecache bound` on a JSON-lines demand (no smoke run needed)."""
    rows = [
        {"stream": "layer0/seq0", "tokens": [[0, 1], [2, 3], [0, 2], [1, 3], [4, 5], [0, 1]]},
        {"stream": "layer0/seq1", "tokens": [[5, 1], [2, 3], [0, 2], [4, 1], [5, 3]]},
    ]
    demand = tmp_path / "demand.jsonl"
    demand.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bound = tmp_path / "a" / "bound.json"
    args = ["--demand", str(demand), "--experts", "6", "--capacity", "3", "--out", str(bound)]
    moecache("bound", *args, "--mixed-share", "0.5", "--seed", "1", check=True)
    sweep = tmp_path / "optimum-sweep.json"
    sweep.write_text(json.dumps(sweep_record(instances=9, k_over_c=[0.5])))
    out = tmp_path / "figures"
    moecache("table", "table_bounds", "--bound", str(bound), "--sweep", str(sweep),
             "--out-dir", str(out), check=True)  # fmt: skip
    table = pd.read_csv(out / "table_bounds.csv")
    report = json.loads(bound.read_text())
    assert table.loc[0, "b_star"] == report["totals"]["b_star"]
    assert table.loc[0, "greedy_minus_b_star"] == 0 and table.loc[0, "integral"]
    mixed = pd.read_csv(out / "table_bounds_mixed_precision.csv")
    assert mixed.loc[0, "lp"] == report["mixed_precision"]["totals"]["lp"]
    text = (out / "table_bounds.md").read_text()
    assert "At unit cost, greedy farthest-future equals B* on every stream of every shard." in text
    assert text.index("**mixed precision**") < text.index("Where the optimum stops being greedy")


def test_replication_table(smoke_run):
    table = pd.read_csv(smoke_run / "figures/table_replication.csv")
    first, second = runs_of(smoke_run, "a"), runs_of(smoke_run, "b")
    assert sorted(table["run"]) == sorted(second)
    for row in table.itertuples():
        assert row.rho == pytest.approx(recomputed(second[row.run])["rho"])
        assert row.rho_first == pytest.approx(recomputed(first[row.run])["rho"])


@pytest.mark.parametrize("name", ["table2", "table3", "table_controller"])
def test_tables_without_inputs_say_so(tmp_path, name):
    """A config without the stage that feeds a table: its table has no rows and says so."""
    assert moecache("table", name, "--out-dir", str(tmp_path)).returncode == 0
    assert pd.read_csv(tmp_path / f"{name}.csv").empty
    assert "Not produced by this run: " in (tmp_path / f"{name}.md").read_text()


@pytest.mark.parametrize(
    "name",
    ["table1", "table2", "table_eviction", "table_bounds", "table_controller", "fig1", "fig2"],
)
def test_every_output_records_its_sources(smoke_run, name):
    """Config hash, versions, device and every input file with its SHA-256."""
    sources = json.loads((smoke_run / "figures" / f"{name}.sources.json").read_text())
    assert sources["inputs"] and {"moecache", "torch", "numpy"} <= set(sources["versions"])
    for entry in sources["inputs"]:
        data = (smoke_run / entry["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    # Replay results name the config hash and device of the run that recorded their trace.
    config_hashes = {
        json.loads((smoke_run / e["path"]).read_text()).get("settings_hash")
        for e in sources["inputs"]
    } - {None}
    assert config_hashes and sources["config_hashes"] == sorted(config_hashes)
    assert sources["devices"]


def test_replay_results_name_the_run_of_their_trace(smoke_run):
    trace_run = json.loads((smoke_run / "results/runs/a/lru-x1.json").read_text())
    for name in ("replay", "bound", "foresight"):
        report = json.loads((smoke_run / f"results/replay/a/{name}.json").read_text())
        assert report["inputs"][0]["path"].endswith("traces/a/lru-x1.parquet")
        assert (report["run"], report["multiplier"]) == ("lru", 1)
        assert report["settings_hash"] == trace_run["settings_hash"]
        assert report["device_name"] == trace_run["device_name"]


def test_figures_are_pdf_and_png(smoke_run):
    for name in ("fig1", "fig2"):
        assert (smoke_run / "figures" / f"{name}.pdf").read_bytes()[:4] == b"%PDF"
        assert (smoke_run / "figures" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.pipeline
def test_fig1_target_builds_only_what_it_needs(tmp_path):
    """`snakemake figures/fig1.pdf`: the model, the first shard's gates, its one
    interleaved decode job and a results file per run (1x and the copy multipliers), the
    bandwidth, the one heads file the controller run reads, and the figure; nothing else."""
    config = load_yaml(SMOKE)
    result = snakemake(tmp_path, "figures/fig1.pdf", "-n", "--cores", "1", "--quiet", "rules")
    jobs = {}
    for line in (result.stdout + result.stderr).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and parts[0] != "total":
            jobs[parts[0]] = int(parts[1])
    runs = config["harness"]["runs"]
    first = list(config["corpus"]["heldout"]["shards"])[0]
    on_first = [r for r in runs.values() if first in r.get("shards", [first])]
    decodes = sum(len(r.get("multipliers", [1])) for r in on_first)
    assert jobs == {
        "corpus": 1,
        "tokenizer": 1,
        "heldout": 1,
        "train": 1,
        "gates": 1,
        "decode": 1,
        "run_results": decodes,
        "bandwidth": 1,
        "controller_train": 1,
        "fig1": 1,
    }, result.stdout


def test_html_report(smoke_run):
    snakemake(smoke_run, "--report", str(smoke_run / "report.html"))
    html = (smoke_run / "report.html").read_text(errors="replace")
    for caption in ("Figure 1. Quality loss", "Figure 2. Share of the gap", "Table 1."):
        assert caption in html
    # Each table's rows and verdicts as rendered from its fields, beside its CSV.
    for table in ("table1", "table_eviction", "table_bounds", "table_replication"):
        assert f"{table}.md" in html, table


def test_the_cost_model_rejects_runs_without_results(tmp_path):
    with pytest.raises(MoecacheError, match="not a decode run"):
        equation.read_points([tmp_path / "none.json"])
