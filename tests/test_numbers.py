"""The measured numbers come from the results files: `moecache numbers` renders them per
section and refreshes only the marked blocks of the README and docs/*.md; the committed
blocks equal the published docs/results/numbers.md, and the smoke run's results fill them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import REPO, moecache
from run_records import (
    bandwidth_record,
    bound_record,
    foresight_record,
    gates_record,
    profile_record,
    run_record,
    sweep_record,
    training_record,
)

from moecache.errors import MoecacheError
from moecache.report import numbers
from moecache.report.readme_blocks import BLOCK_START, SUMMARY, claims_summary, wrapped

BENCH_HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_json(path: Path, data: dict) -> None:
    write(path, json.dumps(data))


def bench(path: Path, seconds: float, cpu: float = 1.0) -> None:
    write(path, BENCH_HEADER + f"{seconds}\t0:00:00\t1\t1\t1\t1\t0\t0\t50\t{cpu}\n")


def totals(**given) -> dict:
    base = {
        "nll": 5.0,
        "scored_tokens": 100,
        "tokens_per_second": 120.0,
        "tokens_per_second_ci": [110.0, 130.0],
        "copies_per_token": 2.0,
        "rho": 1.8,
        "tau_ms": 0.05,
        "compute_ms": 8.0,
        "copy_share": 0.0125,
        "delta_nll": 0.0,
    }
    return {**base, **given}


def run_file(name: str, policy: str, **given) -> dict:
    return run_record(run=name, policy=policy, multiplier=1, shard="a", totals=totals(**given))


def rule_totals(steady: int, gap) -> dict:
    return {"totals": {"steady": steady, "gap_recovered": gap, "fills": 10}}


@pytest.fixture
def workdir(tmp_path) -> Path:
    """The smallest run folder every section reads: one shard, two runs, one device."""
    w = tmp_path / "run"
    write_json(
        w / "results/profile/model.json",
        profile_record(
            device="cpu",
            expert_bytes=196608,
            expert_copy_ms=0.02634,
            token_compute_ms=8.1234,
            timed_tokens=3833,
            heldout_nll=5.12345,
            reuse_per_layer=[0.291, 0.314],
            reuse_shuffled_per_layer=[0.241, 0.262],
            copy_share_of_token=0.00324,
        ),
    )
    write_json(
        w / "results/model/training.json",
        training_record(
            parameters=13404288,
            tokens_seen=614400,
            log=[{"step": 0, "lm_loss": 7.6}, {"step": 1, "lm_loss": 5.0217}],
        ),
    )
    write_json(
        w / "results/model/config.json",
        {"num_hidden_layers": 4, "num_experts": 64, "hidden_size": 128, "intermediate_size": 128},
    )
    write_json(
        w / "results/gates/a.json",
        gates_record(
            base=totals(nll=5.1231761, tokens_per_second=124.7),
            batched_nll=5.1231760,
            runs={
                "lru": totals(nll=5.1231761),
                "all-resident": totals(nll=5.1231761, tokens_per_second=130.5),
            },
            throughput_ratio_pool_vs_own_block=1.0465,
            throughput_ratio_ci=[0.97, 1.12],
            min_throughput_ratio=0.9,
        ),
    )
    write_json(
        w / "results/bandwidth/cpu.json",
        bandwidth_record(
            expert_bytes=196608,
            multipliers={
                "1": {"tau_ms": 0.0409, "group_overhead_ms": 0.002, "ratio_to_1x": 1.0},
                "10": {"tau_ms": 0.23, "group_overhead_ms": 0.003, "ratio_to_1x": 5.62},
            },
            loop_gib_per_s=4.48,
            large_gib_per_s=12.3,
            device_name="x86_64",
        ),
    )
    write_json(w / "results/runs/a/lru-x1.json", run_file("lru", "lru"))
    write_json(
        w / "results/runs/a/static-x1.json",
        run_file("static", "static", delta_nll=0.00243, copy_share=0.002),
    )
    write_json(w / "results/runs/a/lru-x10.json", run_file("lru", "lru", tokens_per_second=1.0))
    # Table 1's cost-model rows: the section decides its verdicts from them (no table1.md).
    write(
        w / "figures/table1_cost_model.csv",
        "multiplier,run,n,predicted_ms,measured_ms,measured_ms_lo,measured_ms_hi,"
        "relative_error,within_5pct,predicted_winner\n"
        "10,lru,2.1,8.58,8.683,8.5,8.9,-0.0119,True,False\n"
        "10,static,0.4,8.021,7.907,7.8,8.0,0.0144,True,True\n",
    )
    write_json(
        w / "results/replay/a/replay.json",
        {
            "schema": 1,
            "capacity": 32,
            "experts": 64,
            "top_k": 8,
            "streams": 32,
            "tokens": 6400,
            "timed_tokens": 6368,
            "run": "lru",
            "multiplier": 1,
            "rules": {
                "lru": rule_totals(7622, 0.0),
                "lfu": rule_totals(5916, 0.3991),
                "farthest-future": rule_totals(3342, 1.0),
            },
        },
    )
    write_json(
        w / "results/replay/a/bound.json",
        bound_record(
            capacity=32,
            experts=64,
            top_k=8,
            totals={
                "b_flat": 3216,
                "b_star": 3372,
                "b_greedy": 3372,
                "greedy_optimal": True,
                "gap": 0.049,
                "coincide_share": 0.125,
                "integral": True,
                "certified": True,
                "lp_seconds": 0.42,
                "streams": 32,
            },
        ),
    )
    write(
        w / "figures/claims.csv",
        "key,claim,where,paper,this_run,setting,other_capacities,tolerance,verdict,why,sources\n"
        "ff_vs_lru,farthest-future copies fewer,Abstract,2.1x,2.20x,C = 32 of 64,C = 16: 1.52x,"
        "±10%,holds,,results/replay/a/c32/replay.json\n"
        "foresight_16,16 tokens,Abstract,96%,not run,,,±5 points,not run,no foresight k = 16,\n",
    )
    bench(w / "benchmarks/train.tsv", 184.0)
    bench(w / "benchmarks/corpus.tsv", 2.4)
    bench(w / "benchmarks/decode/a.tsv", 30.0)
    bench(w / "benchmarks/decode/b.tsv", 40.0)
    bench(w / "benchmarks/figures/numbers.tsv", 999.0)  # its own job: never counted
    return w


def test_sections_render_the_numbers_in_the_files(workdir):
    sections = numbers.build(workdir)
    assert list(sections) == list(numbers.NAMES)
    model = sections["model"]
    assert "13,404,288 (expert weights 12,582,912)" in model
    assert "3 min 4 s (2 steps, 614,400 tokens)" in model
    assert "5.022 nats" in model and "5.123 nats over 3,833 scored tokens" in model
    assert "0.0263 ms" in model and "8.12 ms" in model and "0.32%" in model
    assert "0.29, 0.31" in model and "0.24, 0.26" in model
    gates = sections["gates"]
    assert "5.123176" in gates and "1.0e-07" in gates
    assert "124.7" in gates and "130.5" in gates
    assert "1.05 (95% 0.97-1.12)" in gates and "| 0.9 |" in gates
    bandwidth = sections["bandwidth"]
    assert "| cpu (x86_64) | 10x | 0.230 | 5.62 |" in bandwidth and "| 4.48 | 12.3 |" in bandwidth
    runs = sections["runs"]
    assert "| static | static |" in runs and "0.0024" in runs
    assert "110.0-130.0" in runs and "lru-x10" not in runs and "| 1.0 |" not in runs
    assert "LRU's copies take 1.25% of its step at 1x (copy time over step time)." in runs
    cost = sections["cost_model"]
    assert "| multiplier | run | n | predicted_ms | measured_ms |" in cost
    assert "| 10 | static | 0.4 | 8.021 | 7.907 | 7.8 | 8 | 0.0144 | True | True |" in cost
    assert "- At 10x: equation (1) predicts static, measured fastest static: AGREE." in cost
    assert "- Every run within 5%: yes (largest error +1.4%, static at 10x)." in cost
    replay = sections["replay"]
    assert "| lfu | 39.9% | 5,916 |" in replay
    bounds = "| a | 32 | 32 | 3,216 | 3,372 | 3,372 | yes | 4.9% | 12.5% | yes / yes | 0.42 |"
    assert bounds in replay
    assert "every stream of every shard and capacity: yes" in replay
    claims = sections["claims"]
    assert "| 2.1x | 2.20x | C = 32 of 64 | C = 16: 1.52x | ±10% | **holds** |" in claims
    assert "| not run: no foresight k = 16 |" in claims
    assert "2 claims: holds 1, differs 0, undecided 0, not comparable 0, not run 1." in claims
    runtime = sections["runtime"]
    assert "| decode | 2 | 1 min 10 s | 2.0 s | 30.0 s to 40.0 s |" in runtime
    assert "| all jobs | 4 | **4 min 16 s** | 4.0 s |" in runtime and "999" not in runtime
    assert "of the jobs' CPU time, on " in runtime and " cores." in runtime


def gpu_check_file(path: Path, device: str) -> Path:
    versions = {"torch": "2.5", "transformers": "4.46"}
    check = {"device_name": device, "versions": versions, "seconds": 61.0, "gates": {}}
    write_json(path, {**check, "memory": {}, "bandwidth": None, "paper_layer": None})
    return path


def test_the_gpu_checks_read_are_the_named_devices_never_a_folders(workdir):
    """Only the files given (report.devices's, as Table 1 reads them) are rendered: a
    GPU check lying in measured/ or results/ unnamed is not."""
    named = gpu_check_file(workdir / "measured/gpu-check/h200.json", "NVIDIA H200")
    gpu_check_file(workdir / "measured/gpu-check/l4.json", "NVIDIA L4")
    gpu_check_file(workdir / "results/gpu-check/host.json", "NVIDIA A100")
    assert numbers.build(workdir)["gpu_check"].startswith("No GPU check results")
    section = numbers.build(workdir, gpu_check=[named])["gpu_check"]
    assert "| device | NVIDIA H200 |" in section
    assert "| file | `measured/gpu-check/h200.json` |" in section
    assert "L4" not in section and "A100" not in section


def test_a_changed_number_changes_its_section_only(workdir):
    before = numbers.build(workdir)
    assert numbers.build(workdir) == before  # a pure function of the files
    path = workdir / "results/replay/a/replay.json"
    replay = json.loads(path.read_text())
    replay["rules"]["lfu"]["totals"].update(steady=6000, gap_recovered=0.25)
    path.write_text(json.dumps(replay))
    bench(workdir / "benchmarks/decode/a.tsv", 90.0)
    after = numbers.build(workdir)
    assert "| lfu | 25.0% | 6,000 |" in after["replay"] and "39.9%" not in after["replay"]
    assert "| decode | 2 | 2 min 10 s | 2.0 s |" in after["runtime"]
    assert {name for name in before if before[name] != after[name]} == {"replay", "runtime"}


def test_replay_extras_when_present(workdir):
    subset = {
        "streams": 8,
        "foresight": [{"k": 1, "gap_recovered": 0.187}, {"k": None, "gap_recovered": 1.0}],
        "causal": {"lfu": 0.307, "fifo": -0.5},
    }
    write_json(
        workdir / "results/replay/a/foresight.json",
        foresight_record(
            capacity=32, subsets={"heldout": subset, "all": {**subset, "streams": 32}}
        ),
    )
    write_json(
        workdir / "results/replay/optimum-sweep.json",
        sweep_record(
            instances=42000,
            k_over_c=[0.25, 0.5],
            greedy_not_optimal=0,
            greedy_above_lru=0,
            lp_dp_disagreements=0,
        ),
    )
    replay = numbers.build(workdir)["replay"]
    assert "| 1 | 18.7% | 18.7% |" in replay and "| unlimited | 100.0% |" in replay
    assert "| best causal rule | lfu 30.7% | lfu 30.7% |" in replay
    assert "Optimum sweep: 42,000 instances (k/C 0.25, 0.5)" in replay


def test_a_missing_file_or_key_is_one_line(workdir):
    (workdir / "results/profile/model.json").unlink()
    with pytest.raises(MoecacheError, match="model.json: not a model profile"):
        numbers.build(workdir)
    write_json(workdir / "results/profile/model.json", {"schema": 1, "device": "cpu"})
    with pytest.raises(MoecacheError, match="model.json: a model profile without field settings"):
        numbers.build(workdir)


def readme_text(names, filler="stale") -> str:
    parts = ["# Title\n\nIntro with 1.23 ms typed in.\n"]
    for name in names:
        parts.append(
            f"\n## {name}\n\n<!-- numbers:{name} -->\n{filler}\n<!-- /numbers:{name} -->\n"
        )
    parts.append("\nThe end.\n")
    return "".join(parts)


def outside(text: str) -> str:
    """The text with every marked block emptied."""
    block = r"(<!-- numbers:(\S+) -->).*?(<!-- /numbers:\2 -->)"
    return re.sub(block, r"\1\3", text, flags=re.DOTALL)


def test_refresh_replaces_only_the_marked_blocks(workdir, tmp_path):
    out = tmp_path / "numbers.md"
    assert moecache("numbers", "--workdir", str(workdir), "--out", str(out)).returncode == 0
    sections = numbers.read_sections(out)
    assert sections == numbers.build(workdir)
    readme = tmp_path / "README.md"
    readme.write_text(readme_text(numbers.NAMES))
    before = readme.read_text()
    result = moecache("numbers", "--from", str(out), "--readme", str(readme))
    assert result.returncode == 0, result.stderr
    text = readme.read_text()
    assert "stale" not in text and outside(text) == outside(before)
    assert numbers.blocks(text, "README") == sections
    # From the results themselves the same; a second refresh changes nothing.
    assert moecache("numbers", "--workdir", str(workdir), "--readme", str(readme)).returncode == 0
    assert readme.read_text() == text


@pytest.mark.parametrize(
    "names, says",
    [
        ([*numbers.NAMES, "extra"], "has block extra that"),
        ([n for n in numbers.NAMES if n != "runtime"], "has section(s) runtime that"),
    ],
)
def test_refresh_refuses_unmatched_markers(workdir, tmp_path, names, says):
    out = tmp_path / "numbers.md"
    numbers.write(numbers.build(workdir), out)
    readme = tmp_path / "README.md"
    readme.write_text(readme_text(names))
    before = readme.read_text()
    result = moecache("numbers", "--from", str(out), "--readme", str(readme))
    assert result.returncode != 0
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert readme.read_text() == before


def test_refresh_refuses_a_broken_marker(workdir, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(readme_text(numbers.NAMES).replace("<!-- /numbers:gates -->", ""))
    before = readme.read_text()
    result = moecache("numbers", "--workdir", str(workdir), "--readme", str(readme))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "numbers:" in result.stderr and readme.read_text() == before


def marked_pages() -> dict[Path, dict[str, str]]:
    """README.md and docs/*.md that hold number blocks, with their blocks."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    found = {page: numbers.blocks(page.read_text(), page.name) for page in pages}
    return {page: blocks for page, blocks in found.items() if blocks}


def test_every_section_has_one_block_in_the_readme_or_docs():
    names = [name for blocks in marked_pages().values() for name in blocks]
    assert sorted(names) == sorted(numbers.NAMES)
    # The full scorecard in docs/, its summary in the README.
    assert "claims" in numbers.blocks((REPO / "docs/scorecard.md").read_text(), "scorecard.md")
    assert SUMMARY.search((REPO / "README.md").read_text())


def summary_of(text: str) -> str:
    return re.search(r"<!-- summary:claims -->\n\n(.*)\n\n<!-- /summary:claims -->", text, re.S)[1]


def test_the_readme_summarizes_the_published_scorecard():
    """Per claim its verdict, the claim, the paper's value and this run's, from
    docs/results/claims.csv (`make publish` refreshes it beside the numbers' blocks)."""
    summary = summary_of((REPO / "README.md").read_text())
    assert summary == claims_summary(REPO / "docs/results/claims.csv"), (
        "README.md's scorecard summary differs from docs/results/claims.csv: run `make publish`"
    )


def test_the_summary_block_is_refreshed_from_the_claims_csv_beside_the_sections(
    workdir, tmp_path, capsys
):
    from moecache import cli

    out = tmp_path / "numbers.md"
    numbers.write(numbers.build(workdir), out)
    readme = tmp_path / "README.md"
    stale = "\n<!-- summary:claims -->\nstale\n<!-- /summary:claims -->\n"
    readme.write_text(readme_text(numbers.NAMES) + stale)
    before = readme.read_text()
    # No claims.csv beside numbers.md: one line, nothing written (the command, in-process).
    with pytest.raises(SystemExit) as exit:
        cli.main(["numbers", "--from", str(out), "--readme", str(readme)])
    error = capsys.readouterr().err
    assert exit.value.code == 2 and len(error.strip().splitlines()) == 1
    assert "claims.csv" in error and readme.read_text() == before
    (tmp_path / "claims.csv").write_bytes((workdir / "figures/claims.csv").read_bytes())
    cli.main(["numbers", "--from", str(out), "--readme", str(readme)])
    text = readme.read_text()
    assert summary_of(text) == (
        "- **holds**: farthest-future copies fewer. Paper: 2.1x. This run: 2.20x.\n"
        "- not run: 16 tokens. Paper: 96%. This run: not run.\n\n"
        "2 claims: holds 1, differs 0, undecided 0, not comparable 0, not run 1."
    )
    # From the results themselves (their figures/claims.csv) the same.
    cli.main(["numbers", "--workdir", str(workdir), "--readme", str(readme)])
    assert readme.read_text() == text


def test_a_summary_item_wraps_without_starting_a_markdown_block():
    item = "- differs: a claim. Paper: 0.484 >= 0.481 > 0.430. This run: 1. 2. - + # | x"
    for width in range(20, 60):
        lines = wrapped(item, width).splitlines()
        assert " ".join(line.strip() for line in lines) == item
        assert all(line.startswith("  ") for line in lines[1:])
        for line in lines[1:]:
            assert not BLOCK_START.match(line.split()[0]), (width, line)


def test_the_docs_quote_the_published_numbers():
    """The blocks are docs/results/numbers.md's sections: `make publish` copies a finished
    run's figures/numbers.md there and refreshes them
    (`moecache numbers --from docs/results/numbers.md --readme README.md docs/*.md`)."""
    published = numbers.read_sections(REPO / "docs/results/numbers.md")
    for page, blocks in marked_pages().items():
        assert blocks == {name: published[name] for name in blocks}, (
            f"{page.name}'s measured numbers differ from docs/results/numbers.md: run "
            "`make publish`"
        )


def test_the_smoke_runs_numbers_fill_every_block(smoke_run, tmp_path):
    """Re-derived from the smoke run's results files, the sections equal what its `numbers`
    rule wrote and fill every block of copies of the README and docs pages."""
    sections = numbers.build(smoke_run)
    assert sections == numbers.read_sections(smoke_run / "figures/numbers.md")
    copies = []
    for page in marked_pages():
        copy = tmp_path / page.relative_to(REPO)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(page.read_text())
        copies.append(copy)
    numbers.refresh(copies, sections, "the smoke run", smoke_run / "figures/claims.csv")
    filled = {}
    for copy in copies:
        filled.update(numbers.blocks(copy.read_text(), copy.name))
    assert filled == sections


def test_refresh_fills_blocks_spread_over_files_and_refuses_a_block_held_twice(workdir, tmp_path):
    sections = numbers.build(workdir)
    first, second = tmp_path / "README.md", tmp_path / "harness.md"
    first.write_text(readme_text(numbers.NAMES[:3]))
    second.write_text(readme_text(numbers.NAMES[3:]))
    numbers.refresh([first, second], sections, "the run")
    filled = {**numbers.blocks(first.read_text(), "a"), **numbers.blocks(second.read_text(), "b")}
    assert filled == sections
    second.write_text(readme_text(numbers.NAMES[2:]))  # gates in both files
    before = first.read_text()
    with pytest.raises(MoecacheError, match="numbers:gates is in both"):
        numbers.refresh([first, second], sections, "the run")
    assert first.read_text() == before
