"""`moecache plan --gpu-gib G --host-gib R`: the tier layout (issue 40 point 5). Host RAM
that cannot hold every offloaded expert gets H < N experts per layer and a disk term in
ms/token (reads from a tiered replay of --trace, else a named assumption, priced by
--disk-gbs or the config's tiers.disk_to_host_ms); RAM that holds them all gets 0 on disk
and the prediction of a plan without --host-gib; bad input is one line."""

from __future__ import annotations

import pytest
from test_plan_fit import QWEN3, cycle_trace, refused_in_one_line, replayed_json

from moecache import config as configs
from moecache.errors import MoecacheError
from moecache.plan import fit, inputs, said, tiers

GIB = 2**30
MIB = 2**20


@pytest.fixture(scope="module")
def qwen3() -> dict:
    return configs.load(QWEN3)


@pytest.fixture(scope="module")
def at_24(qwen3) -> dict:
    """Qwen3-30B-A3B on 24 GiB, RAM for every expert (none given, or 128 GiB: what loading
    the checkpoint peaks at, 111.6 GiB, fits) and for some (32 GiB)."""
    stated = inputs.stated_compute(12)
    given = {"link_gbs": 25, "compute": stated}
    return {
        "all": fit.answer(qwen3, 24, **given),
        "fits": fit.answer(qwen3, 24, host_gib=128, **given),
        "short": fit.answer(qwen3, 24, host_gib=32, disk_gbs=3, **given),
    }


def test_ram_short_of_every_expert_puts_the_rest_on_disk(at_24):
    short = at_24["short"]
    layout, expert = short["layout"], short["expert_bytes"]
    assert expert == 9 * MIB
    row = expert * 48  # one expert more in each of the 48 offloaded layers
    n, c, h = 128, short["capacity"], layout["host"]
    assert layout["device"] == c and c <= h < n and layout["disk"] == n - h
    # The most that fits: H experts per layer do, H + 1 do not (one run: no ring beside).
    assert layout["host_bytes"] == h * row <= 32 * GIB < (h + 1) * row
    assert layout["every_expert_host_bytes"] == short["host_peak_bytes"] == n * row
    assert short["disk_read"]["ms"] == pytest.approx(1e3 * expert / (3 * GIB))
    assert "not measured" in short["disk_read"]["source"]
    # No trace: each copy reads from disk with probability (N - H)/(N - C), named so.
    assert short["reads_source"].startswith("assumed, no --trace given")
    for rule, row_ in short["predicted"].items():
        assert row_["reads"] == pytest.approx(row_["rho"] * (n - h) / (n - c))
        assert row_["reads"] > 0
        copy_ms = row_["rho"] * short["tau"]["ms"]
        read_ms = row_["reads"] * short["disk_read"]["ms"]
        assert row_["ms_per_token"] == pytest.approx(12 + copy_ms + read_ms), rule
        assert row_["ms_per_token"] > at_24["all"]["predicted"][rule]["ms_per_token"]
        assert row_["overlapped_ms_at_best"] == pytest.approx(max(12, copy_ms, read_ms))


def test_ram_that_holds_every_expert_leaves_the_prediction_as_it_was(at_24, qwen3):
    fits, alone = at_24["fits"], at_24["all"]
    for answer in (fits, alone):
        assert answer["layout"]["host"] == 128 and answer["layout"]["disk"] == 0
        assert answer["disk_read"] is None and answer["reads_source"] == "nothing on disk only"
    assert fits["predicted"] == alone["predicted"]
    lru = alone["predicted"]["lru"]
    assert lru["reads"] == 0 and lru["ms_per_token"] == 12 + lru["rho"] * alone["tau"]["ms"]
    assert fits["host_peak_bytes"] <= fits["host_load_peak_bytes"] <= 128 * GIB
    # 64 GiB holds every expert (54 GiB) but not the load: the checkpoint's files beside
    # the experts transformers fuses from them.
    with pytest.raises(MoecacheError, match=r"^--host-gib 64: loading the checkpoint peaks"):
        fit.answer(qwen3, 24, host_gib=64, link_gbs=25, compute=inputs.stated_compute(12))


def test_the_printed_layout(at_24):
    short = said.lines(at_24["short"])
    h = at_24["short"]["layout"]["host"]
    assert short[3].startswith(f"  host: H = {h} experts per layer, ")
    assert short[5].startswith(f"  disk: N - H = {128 - h} experts per layer on disk only")
    assert "disk reads/token" in short[9] and "c + rho tau + reads tau_disk" in short[9]
    c = at_24["short"]["capacity"]
    layout = f"  layout per layer: C = {c} on the device, H = {{}} in host RAM, {{}} on disk only"
    assert short[-2] == layout.format(h, 128 - h)
    # RAM for every expert: the lines without --host-gib, its size named on the host line.
    fits, alone = said.lines(at_24["fits"]), said.lines(at_24["all"])
    assert fits[-2] == alone[-2] == layout.format(128, 0)
    assert [i for i, (a, b) in enumerate(zip(fits, alone, strict=True)) if a != b] == [3]
    assert fits[3] == alone[3] + ", of 128 GiB" and "disk" not in "".join(fits[:-2])


def made_up_plan(**parts) -> dict:
    """A plan's layout facts: 8 experts of 1/4 GiB in 2 layers, C = 2; `parts` beside."""
    return {
        "num_experts": 8,
        "capacity": 2,
        "offloaded_layers": [0, 1],
        "expert_bytes": GIB // 4,
        "pinned_host_bytes": 4 * GIB,
        **parts,
    }


def test_the_host_counts_the_ring_beside_its_experts():
    """A made-up plan: 8 experts of 1/4 GiB in 2 layers, C = 2, a 1/2 GiB ring beside."""
    chosen = made_up_plan()
    layout = tiers.layout(chosen, 4 * GIB + GIB // 2, 2.5)
    assert (layout["host"], layout["disk"]) == (4, 4)  # (2.5 - 0.5) GiB over 1/2 GiB a row
    assert layout["host_bytes"] == int(2.5 * GIB) and layout["host_beside_bytes"] == GIB // 2
    assert tiers.layout(chosen, 4 * GIB, None)["disk"] == 0
    with pytest.raises(MoecacheError, match=r"^--host-gib 1: host RAM holds 1 experts per layer"):
        tiers.layout(chosen, 4 * GIB + GIB // 2, 1)


def test_a_disk_read_is_the_configs_price_or_a_stated_link():
    own = tiers.disk_read(9 * MIB, {"tiers": {"disk_to_host_ms": 2.5}}, None)
    assert own["ms"] == 2.5 and own["source"].startswith("the config's")
    default = tiers.disk_read(9 * MIB, {}, None)
    schema = configs.schema()["properties"]["tiers"]["properties"]
    assert default["ms"] == schema["disk_to_host_ms"]["default"]
    assert "not measured" in default["source"]
    assert tiers.disk_read(GIB, {}, 2)["ms"] == pytest.approx(500)


def test_replayed_reads_count_past_the_hosts_fill(tmp_path):
    """Experts 0, 1, 2, 3, 0, ... one a token, C = 1 over an LRU host of H = 3: every token
    misses on the device and on the host, so after the host's first 3 reads every token
    reads one expert; a farthest-future host keeps 2 of the 3 it will need next."""
    tokens = 41
    cycle_trace(tmp_path / "t.parquet", tokens, 4)
    traced = inputs.traced_demand(tmp_path / "t.parquet", 4, 1)
    reads = tiers.reads_replayed(traced, 1, 3, 10, inputs.RULES)["per_token"]
    assert reads["lru"] == pytest.approx((tokens - 3) / (tokens - 1) * 10)
    assert 0 < reads["farthest-future"] < 0.5 * reads["lru"]
    assert tiers.reads_replayed(traced, 1, 4, 10, inputs.RULES)["per_token"] == {
        "lru": 0.0,
        "farthest-future": 0.0,
    }


def test_json_with_a_trace_replays_the_tiers(tmp_path, capsys):
    answer = replayed_json(
        capsys, tmp_path / "t.parquet", "--host-gib", 32, "--link-gbs", 25, "--compute-ms", 12
    )
    layout = answer["layout"]
    c, h = layout["device"], layout["host"]
    assert c == answer["capacity"] and h < 128 and layout["disk"] == 128 - h
    assert answer["reads_source"].startswith(f"replayed: {tmp_path / 't.parquet'} (3 layers")
    traced = inputs.traced_demand(tmp_path / "t.parquet", 128, 8)
    expected = tiers.reads_replayed(traced, c, h, 48, inputs.RULES)["per_token"]
    disk = answer["disk_read"]
    assert disk["ms"] == 5.1 and "default" in disk["source"]  # the config has no tiers
    for rule, row in answer["predicted"].items():
        assert row["reads"] == pytest.approx(expected[rule]) and row["reads"] > 0
        assert row["read_ms"] == pytest.approx(row["reads"] * 5.1)
        assert row["ms_per_token"] == pytest.approx(
            12 + row["rho"] * answer["tau"]["ms"] + row["read_ms"]
        )


def test_bad_host_and_disk_flags_are_one_line(tmp_path, capsys):
    cases = {
        "--host-gib 0: must be above 0": ("--gpu-gib", "24", "--host-gib", "0"),
        "--disk-gbs 0: must be above 0": ("--gpu-gib", 24, "--host-gib", 32, "--disk-gbs", 0),
        "--disk-gbs: give --host-gib": ("--gpu-gib", "24", "--disk-gbs", "3"),
        "--disk-gbs: give --gpu-gib": ("--disk-gbs", "3"),
        "fewer than the device's C = ": ("--gpu-gib", "24", "--host-gib", "16"),
    }
    refused_in_one_line(capsys, tmp_path, cases)


def test_a_host_that_cannot_load_the_checkpoint_is_refused_naming_the_parts():
    """Every expert in host RAM (the harness's jobs) but a load phase above R: one line
    naming the checkpoint's files, the fused experts and the stacks; with a disk tier the
    load peak is reported beside the layout."""
    chosen = made_up_plan(
        host_load_peak_bytes=9 * GIB,
        checkpoint_file_bytes=5 * GIB,
        read_experts_bytes=2 * GIB,
        fused_experts_bytes=GIB,
        fusing_stacks_bytes=GIB,
    )
    with pytest.raises(MoecacheError, match=r"^--host-gib 8: loading the checkpoint peaks") as e:
        tiers.layout(chosen, 4 * GIB, 8)
    assert "its files 5.000 GiB" in str(e.value) and "\n" not in str(e.value)
    assert "read from them in place, 2.000 GiB" in str(e.value)
    assert tiers.layout(chosen, 4 * GIB, 9)["load_peak_bytes"] == 9 * GIB
    assert tiers.layout(chosen, 4 * GIB, 2.5)["disk"] == 3  # a server's layout: not loaded
