"""`moecache plan --gpu-gib G`: the largest C with every MoE layer offloaded fits G less the
stated reserve (--reserve-gib) and C + 1 does not (by accountant.account, the jobs' own sizes), rho
comes from a replayed trace or the embedded trace's published share, beside uniform
routing's LRU copies, tau from a measured bandwidth file or a stated link, and bad input
is one line with a non-zero exit and no output. docs/plan.md's table is what
`moecache plan-table` prints."""

from __future__ import annotations

import copy
import csv
import itertools
import json
import re

import numpy as np
import pytest
from conftest import REPO, TINY_ARCH, moecache
from run_records import run_record, sequence_row

from moecache import cli
from moecache import config as configs
from moecache.config import run_spec
from moecache.errors import MoecacheError
from moecache.plan import RESERVE_GIB, cards, fit, inputs
from moecache.replay import convert
from moecache.schedule import accountant

GIB = 2**30
QWEN3 = REPO / "config" / "qwen3-30b-a3b.yaml"
H200 = REPO / "measured" / "gpu-check" / "nvidia-h200.json"


@pytest.fixture(scope="module")
def qwen3() -> dict:
    return configs.load(QWEN3)


def device_at(settings: dict, capacity: int, layers) -> int:
    """What one run at `capacity` holds on the device with `layers` offloaded, as accountant.account
    gives it (weights, C slots per layer, the KV cache)."""
    changed = copy.deepcopy(settings)
    changed["harness"].update(restricted_layers=list(layers), capacity=capacity)
    report = accountant.account(changed)
    return report["device_bytes"]


def write_trace(path, rows, experts: int) -> None:
    lines = path.with_suffix(".jsonl")
    lines.write_text("".join(json.dumps(r) + "\n" for r in rows))
    convert.convert(lines, path, experts)


def cycle_trace(path, tokens: int, experts: int) -> None:
    """One sequence in 2 layers, one expert a token: 0, 1, ..., experts - 1, 0, 1, ..."""
    rows = [
        {"sequence": "s", "layer": layer, "token": t, "experts": [t % experts]}
        for t in range(tokens)
        for layer in range(2)
    ]
    write_trace(path, rows, experts)


def random_trace(path, experts=128, top_k=8, layers=3, sequences=2, tokens=40, seed=0):
    rng = np.random.default_rng(seed)
    rows = [
        {"sequence": f"s{s}", "layer": layer, "token": t, "experts": chosen.tolist()}
        for s in range(sequences)
        for t in range(tokens)
        for layer in range(layers)
        for chosen in [rng.choice(experts, top_k, replace=False)]
    ]
    write_trace(path, rows, experts)


def test_the_chosen_capacity_fits_and_one_more_does_not(qwen3):
    found = fit.largest_capacity(qwen3, 24)
    chosen = found["chosen"]
    every = list(range(48))  # Qwen3-30B-A3B: every layer sparse
    assert chosen["offloaded_layers"] == every
    c = chosen["capacity"]
    assert 8 <= c < 128
    # Within the card less the default reserve.
    left = (24 - RESERVE_GIB) * GIB
    assert device_at(qwen3, c, every) <= left < device_at(qwen3, c + 1, every)
    assert fit.device_peak(found["next"]) == device_at(qwen3, c + 1, every)
    # The settings are left as they were: the config's own 24 layers at C = 64.
    assert qwen3["harness"]["capacity"] == 64 and len(qwen3["harness"]["restricted_layers"]) == 24


def test_a_gpu_that_holds_every_expert_picks_c_equal_n(qwen3):
    found = fit.largest_capacity(qwen3, 80)
    assert found["chosen"]["capacity"] == 128 and found["next"] is None


def test_too_small_a_gpu_is_one_line(qwen3):
    with pytest.raises(fit.TooSmall, match=r"^--gpu-gib 2: even C = top_k = 8 with all 48 MoE"):
        fit.largest_capacity(qwen3, 2)


def test_the_reserve_is_kept_back_and_a_larger_one_never_picks_a_larger_c(qwen3):
    """Each reserve's C: one run's peak fits G - R and C + 1's does not; C never grows with
    R; the study's jobs on a card config keep the same reserve."""
    every = list(range(48))
    picked = []
    for kept in (0, 0.5, 1, 2, 4):
        found = fit.largest_capacity(qwen3, 24, reserve_gib=kept)
        c = found["chosen"]["capacity"]
        assert fit.device_peak(found["chosen"]) <= (24 - kept) * GIB
        assert device_at(qwen3, c + 1, every) > (24 - kept) * GIB
        picked.append(c)
    assert picked == sorted(picked, reverse=True) and picked[0] > picked[-1]
    card = configs.load(REPO / "config" / "cards" / "qwen3-30b-a3b-24gib.yaml")
    jobs = fit.largest_capacity(card, 24, figure="jobs", reserve_gib=2)
    assert fit.jobs_peak(jobs["chosen"]) <= 22 * GIB < fit.jobs_peak(jobs["next"])
    with pytest.raises(MoecacheError, match=r"^--reserve-gib -1: must be at least 0$"):
        fit.largest_capacity(qwen3, 24, reserve_gib=-1)


def test_tau_scales_the_measured_loop_to_the_experts_bytes():
    measured = json.loads(H200.read_text())
    expert = 9 * 2**20
    tau = inputs.tau_from_bandwidth(H200, expert)
    assert tau["ms"] == pytest.approx(1e3 * expert / (measured["loop_gib_per_s"] * GIB))
    assert "NVIDIA H200" in tau["source"] and tau["source"].startswith("measured")
    stated = inputs.tau_from_link(25, expert)
    assert stated["ms"] == pytest.approx(9 / 1024 / 25 * 1e3)
    assert "not measured" in stated["source"]


def test_a_file_without_the_loops_bandwidth_is_refused(tmp_path):
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps({"tau_ms": 1.0}))
    with pytest.raises(MoecacheError, match="no loop_gib_per_s"):
        inputs.tau_from_bandwidth(bad, 1)


def published_lru(capacity: int) -> float:
    """Steady LRU copies per token per layer of the embedded run at C/64, mean of its
    shards, read from the committed table (4 offloaded layers)."""
    with open(REPO / "docs" / "results" / "table_eviction.csv", newline="") as rows:
        found = [
            float(r["copies_per_token"])
            for r in csv.DictReader(rows)
            if r["rule"] == "lru" and r["capacity"] == str(capacity) and r["experts"] == "64"
        ]
    assert found
    return sum(found) / len(found) / 4


def test_embedded_rho_is_the_published_share_at_the_same_ratio():
    at_quarter = inputs.rho_embedded(32, 128, 8, 48)
    assert at_quarter["per_token"]["lru"] == pytest.approx(published_lru(16) * 48)
    assert "not this model's routing" in at_quarter["source"]
    # Between the published points: linear in C/N; k scales it (k = 2 of the embedded 8).
    middle = inputs.rho_embedded(3, 8, 2, 10)["per_token"]["lru"]
    expected = (published_lru(16) + (published_lru(32) - published_lru(16)) * 0.5) * 2 / 8 * 10
    assert middle == pytest.approx(expected)
    assert inputs.rho_embedded(64, 64, 8, 4)["per_token"] == {"lru": 0.0, "farthest-future": 0.0}
    # Below C/N = 1/4: the first segment's line, never above k copies a layer.
    low = inputs.rho_embedded(2, 64, 2, 1)["per_token"]["lru"]
    assert published_lru(16) * 2 / 8 < low <= 2
    ff = inputs.rho_embedded(32, 128, 8, 48)["per_token"]["farthest-future"]
    assert 0 < ff < at_quarter["per_token"]["lru"]


def test_rho_from_a_trace_counts_steady_copies_per_token_per_layer(tmp_path):
    """Experts 0, 1, 2, 0, 1, 2, ... one at a time, C = 2: LRU copies at every token once
    the pool is full (tokens 2..T-1), farthest-future at about every other one."""
    tokens = 31
    cycle_trace(tmp_path / "t.parquet", tokens, 3)
    rho = inputs.rho_from_trace(tmp_path / "t.parquet", 2, 3, 1, layers=10)["per_token"]
    assert rho["lru"] == pytest.approx((tokens - 2) / (tokens - 1) * 10)
    assert rho["farthest-future"] < 0.6 * rho["lru"]
    with pytest.raises(MoecacheError, match="routes top-1 of 3 experts; the model routes top-8"):
        inputs.rho_from_trace(tmp_path / "t.parquet", 16, 128, 8, layers=48)


def run_file(path, source: str) -> None:
    sequences = [
        sequence_row(sequence=0, timed_tokens=10, step_seconds=0.5, copy_seconds=0.1),
        sequence_row(sequence=1, timed_tokens=30, step_seconds=1.0, copy_seconds=0.2),
    ]
    settings = {"model": {"source": source}}
    path.write_text(json.dumps(run_record(settings=settings, sequences=sequences)))


def test_compute_from_a_measured_run_is_its_step_less_its_copies(tmp_path):
    run_file(tmp_path / "run.json", "Qwen/Qwen3-30B-A3B")
    c = inputs.compute_from_run(tmp_path / "run.json", "Qwen/Qwen3-30B-A3B")
    assert c["ms"] == pytest.approx(1e3 * (1.5 - 0.3) / 40)
    with pytest.raises(MoecacheError, match="a run of Qwen/Qwen3-30B-A3B, not of other/model"):
        inputs.compute_from_run(tmp_path / "run.json", "other/model")


def test_equation_one_and_the_bound():
    rho = {"lru": 10.0}
    tau = {"ms": 0.5}
    full = fit.predictions(rho, tau, {"ms": 3.0})["lru"]
    assert full["ms_per_token"] == 8.0 and full["tokens_per_second"] == pytest.approx(125)
    assert full["overlapped_ms_at_best"] == 5.0 and full["ms_per_token_at_least"] is None
    bound = fit.predictions(rho, tau, None)["lru"]
    assert bound["ms_per_token"] is None and bound["ms_per_token_at_least"] == 5.0
    assert bound["tokens_per_second_at_most"] == pytest.approx(200)
    assert fit.predictions(rho, None, None)["lru"]["copy_ms"] is None


def main(capsys, *args) -> tuple[int, str, str]:
    """`moecache ARGS` in this process: exit status, stdout, stderr."""
    try:
        cli.main([str(a) for a in args])
        status = 0
    except SystemExit as stop:
        status = stop.code
    out = capsys.readouterr()
    return status, out.out, out.err


def test_plan_gpu_gib_names_c_device_peak_and_ms_per_token():
    """The installed command, as a user runs it: a stated link and no c, so a bound; no
    trace, so LRU's rho is a range from the embedded model's share to uniform routing."""
    result = moecache("plan", "--configfile", str(QWEN3), "--gpu-gib", "24", "--link-gbs", "25")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith(
        "top-8), keeping 1 GiB in reserve for the CUDA context and the allocator (--reserve-gib)"
    )
    c = int(re.fullmatch(r"  C = (\d+) experts per layer \(one expert 9.00 MiB\)", lines[1])[1])
    assert re.fullmatch(rf"  device peak: \d+\.\d+ GiB \(C = {c + 1} would need .*\)", lines[2])
    assert lines[3] == "  host peak: 54.000 GiB (the offloaded experts, pinned)"
    assert lines[4].startswith(f"  rho: {inputs.EMBEDDED_SAID} (the embedded trace's share")
    uniform = inputs.rho_uniform(c, 128, 8, 48)["per_token"]["lru"]
    bound = (
        r"  lru: rho between [\d.]+ \(embedded model, scaled\) and "
        rf"{uniform:.3f} \(uniform routing\) copies/token, "
        r"ms/token >= rho tau = [\d.]+ to [\d.]+ \(at most [\d.]+ to [\d.]+ tokens/s\)"
    )
    assert re.fullmatch(bound, lines[7]), lines[7]
    assert lines[9].startswith("  uniform routing: each token's k = 8 experts drawn uniformly")
    assert f"= {uniform:.3f} copies/token, " in lines[9]
    own = r"  the config's own study \(C = 64 on 24 layers, its jobs' peak\): [\d.]+ GiB "
    own += "beside the 1 GiB reserve: does NOT fit"
    assert re.fullmatch(own, lines[-1])


def replayed_json(capsys, trace, *args) -> dict:
    """`moecache plan` on Qwen3-30B-A3B at 24 GiB with a random trace written to `trace`
    replayed, and `args`: its --json answer."""
    random_trace(trace)
    plan_args = ("plan", "--configfile", QWEN3, "--gpu-gib", 24, "--trace", trace, "--json")
    status, out, err = main(capsys, *plan_args, *args)
    assert status == 0, err
    return json.loads(out)


def test_json_with_a_replayed_trace_a_measured_link_and_a_stated_compute(tmp_path, capsys):
    given = ("--bandwidth", H200, "--compute-ms", 12, "--out", tmp_path / "a.json")
    answer = replayed_json(capsys, tmp_path / "t.parquet", *given)
    assert answer == json.loads((tmp_path / "a.json").read_text())
    c = answer["capacity"]
    assert c == fit.largest_capacity(configs.load(QWEN3), 24)["chosen"]["capacity"]
    assert answer["device_peak_bytes"] <= 23 * GIB < answer["next_device_peak_bytes"]
    assert answer["reserve_gib"] == RESERVE_GIB == 1
    assert answer["rho_source"].startswith(f"replayed: {tmp_path / 't.parquet'} (3 layers")
    expected = inputs.rho_from_trace(tmp_path / "t.parquet", c, 128, 8, 48)["per_token"]
    lru = answer["predicted"]["lru"]
    assert lru["rho"] == pytest.approx(expected["lru"]) and lru["rho"] > 0
    assert lru["ms_per_token"] == pytest.approx(12 + lru["rho"] * answer["tau"]["ms"])
    assert lru["tokens_per_second"] == pytest.approx(1e3 / lru["ms_per_token"])
    assert answer["config_run"]["fits"] is False


def test_bad_input_is_one_line_and_no_output(tmp_path, capsys):
    (tmp_path / "broken.parquet").write_text("not parquet")
    cases = {
        "--gpu-gib 2": ("--gpu-gib", "2"),
        "no such file": ("--gpu-gib", "24", "--bandwidth", tmp_path / "missing.json"),
        "not a Parquet file": ("--gpu-gib", "24", "--trace", tmp_path / "broken.parquet"),
        "--host-gib 16": ("--gpu-gib", "24", "--host-gib", "16"),
        "--trace: give --gpu-gib": ("--trace", tmp_path / "broken.parquet"),
    }
    refused_in_one_line(capsys, tmp_path, cases)


def refused_in_one_line(capsys, tmp_path, cases: dict) -> None:
    """Each `moecache plan` on Qwen3-30B-A3B with its args exits non-zero with one line
    holding its needle, and writes nothing."""
    for needle, args in cases.items():
        status, out, err = main(
            capsys, "plan", "--configfile", QWEN3, *args, "--out", tmp_path / "o"
        )
        assert status != 0 and out == "", needle
        [line] = err.strip().splitlines()
        assert line.startswith("moecache: error: ") and needle in line, line
    assert not (tmp_path / "o").exists()


def test_the_docs_table_is_what_plan_table_prints():
    """docs/plan.md's table, as `moecache plan-table` prints it from the committed files."""
    doc = (REPO / "docs" / "plan.md").read_text()
    command = re.search(r"```sh\n(moecache plan-table [^`]*?)\n```", doc)[1]
    words = command.replace("\\\n", " ").split()
    configs_given = words[words.index("--configfile") + 1 : words.index("--gpu-gib")]
    gibs = [float(g) for g in words[words.index("--gpu-gib") + 1 : words.index("--bandwidth")]]
    bandwidth = REPO / words[words.index("--bandwidth") + 1]
    table = cards.table([REPO / c for c in configs_given], gibs, bandwidth)
    assert table in doc, "docs/plan.md: regenerate its table with the command above it"
    assert len(configs_given) == 3 and gibs == [24, 48, 80]


def test_a_checkpoint_folder_offloads_its_moe_layers_only(tmp_path):
    """--model: a checkpoint's config.json (a tiny Qwen3-MoE, layer 0 dense) replaces the
    config's model.source; its dense layer is never offloaded, and C steps one expert of
    every MoE layer at a time."""
    from moecache.model import tiny

    arch = dict(TINY_ARCH)
    folder = str(tmp_path / "ckpt")
    tiny.config("qwen3_moe", arch, 128).save_pretrained(folder)
    # The embedded default's harness and corpus (its jobs' peaks are sized too), this model.
    settings = configs.load(REPO / "config" / "config.yaml")
    settings["model"] = {"source": "elsewhere", "family": "qwen3_moe", "dtype": "float32"}
    settings["model"]["architecture"] = arch
    settings["harness"].update(restricted_layers=[1], capacity=8, runs={"lru": run_spec("lru")})
    settings["corpus"]["heldout"]["max_tokens"] = 16
    at = {c: fit.sized(settings, c, [1, 2], folder) for c in (10, 11)}
    budget = fit.device_peak(at[10]) / GIB
    found = fit.answer(settings, budget, source=folder, reserve_gib=0)  # a toy card
    assert found["offloaded_layers"] == [1, 2] and found["capacity"] == 10
    assert found["next_device_peak_bytes"] == fit.device_peak(at[11])
    step = fit.device_peak(at[11]) - fit.device_peak(at[10])
    assert step == 2 * found["expert_bytes"]  # one slot more in each of the 2 MoE layers
    assert found["source"] == folder


def test_without_the_published_replay_rho_asks_for_a_trace(tmp_path):
    with pytest.raises(MoecacheError, match="the published replay is not here.*give --trace"):
        inputs.embedded_shares(tmp_path / "table.csv")


def test_the_reserve_is_stated_and_a_negative_one_refused(tmp_path, capsys):
    args = ("plan", "--configfile", QWEN3, "--gpu-gib", 24, "--link-gbs", 25)
    status, out, err = main(capsys, *args, "--reserve-gib", 2, "--json")
    assert status == 0, err
    answer = json.loads(out)
    assert answer["reserve_gib"] == 2
    assert answer["device_peak_bytes"] <= 22 * GIB < answer["next_device_peak_bytes"]
    status, out, err = main(capsys, *args, "--reserve-gib", 0)
    assert status == 0, err
    assert "keeping nothing in reserve (--reserve-gib 0" in out.splitlines()[0]
    status, out, err = main(capsys, *args, "--reserve-gib", -1)
    assert (status, out, err) == (2, "", "moecache: error: --reserve-gib -1: must be at least 0\n")
    cases = {
        "--reserve-gib -1: must be at least 0": ("--gpu-gib", 24, "--reserve-gib", -1),
        "--reserve-gib 24: leaves nothing of the 24 GiB": ("--gpu-gib", 24, "--reserve-gib", 24),
        "--reserve-gib: give --gpu-gib": ("--reserve-gib", 1),
    }
    refused_in_one_line(capsys, tmp_path, cases)


def lru_chain_copies(experts: int, top_k: int, capacity: int) -> float:
    """LRU's copies per token in the steady state of uniform k-of-N routing, solved exactly
    by brute force: every ordered pool (least recent first) a state, every k-subset a token
    of equal chance, the token's experts made most recent and the least recent others
    evicted; the chain's stationary distribution weighs each state's copies."""
    states = list(itertools.permutations(range(experts), capacity))
    index = {s: i for i, s in enumerate(states)}
    tokens = list(itertools.combinations(range(experts), top_k))
    move = np.zeros((len(states), len(states)))
    copies = np.zeros(len(states))
    for i, pool in enumerate(states):
        for token in tokens:
            missed = [e for e in token if e not in pool]
            others = [e for e in pool if e not in token]
            after = tuple(others[len(missed) :]) + token
            move[i, index[after]] += 1 / len(tokens)
            copies[i] += len(missed) / len(tokens)
    values, vectors = np.linalg.eig(move.T)
    stationary = np.real(vectors[:, np.argmin(abs(values - 1))])
    return float(copies @ (stationary / stationary.sum()))


def test_uniform_routing_is_k_times_one_less_c_over_n():
    """The closed form against the LRU chain solved exactly, and the formula's parts."""
    for experts, top_k, capacity in ((5, 2, 3), (6, 2, 2), (6, 3, 4)):
        exact = lru_chain_copies(experts, top_k, capacity)
        bound = inputs.rho_uniform(capacity, experts, top_k, 1)
        assert bound["per_layer"] == pytest.approx(exact, abs=1e-9)
    twelve = inputs.rho_uniform(47, 128, 8, 12)
    assert twelve["per_token"]["lru"] == pytest.approx(8 * (1 - 47 / 128) * 12)
    assert inputs.rho_uniform(128, 128, 8, 48)["per_token"]["lru"] == 0


def test_uniform_routing_is_what_the_replay_engine_counts(tmp_path):
    """A seeded uniform trace (2 layers, 1,500 tokens, 4 of 16 experts) replayed with LRU
    at C = 8: steady copies per timed token within 2% of k (1 - C/N), the fill aside."""
    random_trace(tmp_path / "u.parquet", 16, 4, layers=2, sequences=1, tokens=1500, seed=7)
    replayed = inputs.rho_from_trace(tmp_path / "u.parquet", 8, 16, 4, layers=1)["per_token"]
    assert replayed["lru"] == pytest.approx(inputs.rho_uniform(8, 16, 4, 1)["per_layer"], rel=0.02)


CARDS = sorted((REPO / "config" / "cards").glob("*.yaml"))


@pytest.mark.parametrize("card", CARDS, ids=lambda path: path.name)
def test_uniform_routing_copies_at_least_the_embedded_share_on_each_card(card):
    settings = configs.load(card)
    shape = fit.sizes(settings)
    c, n, k = settings["harness"]["capacity"], shape.num_experts, shape.num_experts_per_tok
    layers = len(settings["harness"]["restricted_layers"])
    embedded = inputs.rho_embedded(c, n, k, layers)["per_token"]["lru"]
    uniform = inputs.rho_uniform(c, n, k, layers)["per_token"]["lru"]
    assert 0 < embedded <= uniform


def test_without_a_trace_json_carries_both_ends_of_the_range(capsys):
    args = ("plan", "--configfile", QWEN3, "--gpu-gib", 24, "--link-gbs", 25, "--json")
    status, out, err = main(capsys, *args, "--compute-ms", 12)
    assert status == 0, err
    answer = json.loads(out)
    c = answer["capacity"]
    assert answer["rho_from"] == "embedded"
    assert answer["rho_source"].startswith(inputs.EMBEDDED_SAID)
    assert answer["rho_uniform"] == inputs.rho_uniform(c, 128, 8, 48)
    embedded, uniform = answer["predicted"]["lru"], answer["predicted_uniform"]["lru"]
    assert uniform["rho"] == answer["rho_uniform"]["per_token"]["lru"] > embedded["rho"]
    assert uniform["ms_per_token"] == pytest.approx(12 + uniform["rho"] * answer["tau"]["ms"])
    assert uniform["ms_per_token"] > embedded["ms_per_token"]


def test_with_a_trace_rho_is_not_scaled_from_the_embedded_model(tmp_path, capsys):
    random_trace(tmp_path / "t.parquet")
    args = ("plan", "--configfile", QWEN3, "--gpu-gib", 24, "--trace", tmp_path / "t.parquet")
    status, out, err = main(capsys, *args)
    assert status == 0, err
    assert "embedded" not in out and "scaled by k" not in out and "uniform" not in out
    assert re.search(r"^  lru: rho = [\d.]+ copies/token$", out, re.MULTILINE)
    answer = replayed_json(capsys, tmp_path / "t.parquet")
    assert answer["rho_from"] == "trace" and inputs.EMBEDDED_SAID not in answer["rho_source"]
    assert answer["rho_uniform"]["per_token"]["lru"] > 0  # the reference, in JSON only
