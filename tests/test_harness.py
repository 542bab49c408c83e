"""The harness: exactness gates hold and can fail, copy counts repeat, bad parameters stop
with one line, and the smoke pipeline decoded every policy."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from conftest import SMOKE, load_settings, load_yaml, moecache
from fake_clock import FakeClock
from run_records import gates_record

from moecache.config import run_spec
from moecache.data import corpus
from moecache.errors import MoecacheError
from moecache.harness import bandwidth, decode, decode_totals, gates, timing
from moecache.harness import link as link_module
from moecache.harness import pool as pool_module
from moecache.harness.link import SlowLink
from moecache.harness.pool import ExpertPool, HostExperts
from moecache.harness.pooled_block import PooledMoeBlock
from moecache.model import checkpoint
from moecache.model.memory import slow_link_kind as link_kind
from moecache.policies import POLICIES, ZOO, PoolChange
from moecache.records.bandwidth import BandwidthResult, LinkCheckResult
from moecache.records.gates import GatesResult
from moecache.records.io import read_dict
from moecache.records.profile import ProbeResult


@pytest.fixture
def smoke(smoke_run):
    config = load_settings(SMOKE)
    arch = config["model"]["architecture"]
    model = checkpoint.load(smoke_run / "results/model", "float32", "cpu", arch)
    # The smoke model is barely trained: its logits hardly depend on the hidden state. Scale
    # the experts and the output head up so that which expert computes a token visibly
    # changes the NLL (a wrong expert then moves it by about ten times the gate's tolerance).
    for layer in model.model.layers:
        layer.mlp.experts.gate_up_proj.data *= 20
        layer.mlp.experts.down_proj.data *= 50
    model.lm_head.weight.data *= 20
    sequences = corpus.read_sequences(smoke_run / "results/heldout/a.parquet")
    return config, model, sequences


def test_gates_pass_on_the_real_pool(smoke):
    config, model, sequences = smoke
    report = gates.run(model, sequences, config["harness"])
    assert report["failures"] == []
    low, high = report["throughput_ratio_ci"]
    assert low <= report["throughput_ratio_pool_vs_own_block"] <= high
    gates.check(report)


def test_the_gates_time_the_compared_pair_over_repeated_passes(smoke, monkeypatch):
    """The own and pooled blocks are timed `gate_repeats` times (each sequence keeps its
    median), the other lossless runs once; the report keeps each sequence's seconds."""
    config, model, sequences = smoke
    passes = []
    real = decode.decode

    def spy(model, sequences, device, arms, own, warmup, repeats, seed, lockstep=False):
        passes.append((sorted(arm.name for arm in arms), repeats))
        return real(model, sequences, device, arms, own, warmup, repeats, seed, lockstep)

    monkeypatch.setattr(decode, "decode", spy)
    report = gates.run(model, sequences, config["harness"] | {"gate_repeats": 2})
    assert passes == [(["all-resident", "base"], 2), (["dwell-1-window-1", "lru"], 1)]
    assert report["gate_repeats"] == 2
    assert {k: len(v) for k, v in report["step_seconds"].items()} == {
        "base": len(sequences),
        "all-resident": len(sequences),
    }


def test_the_timed_passes_run_without_the_cyclic_collector(smoke, monkeypatch):
    """A full collection would land on whichever arm is decoding: it is off while timing
    and back on after."""
    import gc

    config, model, sequences = smoke
    during = []
    real = decode.one_pass

    def spy(*args):
        during.append((args[-1] is not None, gc.isenabled()))
        return real(*args)

    monkeypatch.setattr(decode, "one_pass", spy)
    with decode.offloaded(model, [1, 2], 8, "cpu", 8) as off:
        decode.decode(model, sequences[:1], "cpu", arms_of(off, config, ["lru"]), off.own, 2)
    assert during == [(False, True), (True, False)]  # warm-up collects; the timed pass not
    assert gc.isenabled()


def test_a_wrong_slot_map_trips_the_gates(smoke, monkeypatch):
    config, model, sequences = smoke
    apply = ExpertPool.apply

    def shifted(self, plan):  # the pool keeps a true map; the block reads one a slot off
        if getattr(self, "shifted_view", None) is self.slot_of:
            self.slot_of = self.true_map
        apply(self, plan)
        self.true_map = self.slot_of
        self.shifted_view = {e: (s + 1) % self.capacity for e, s in self.true_map.items()}
        self.slot_of = self.shifted_view

    monkeypatch.setattr(ExpertPool, "apply", shifted)
    report = gates.run(model, sequences, config["harness"])
    failed = " ".join(report["failures"])
    for name in gates.lossless_runs(8, 16):
        assert f"{name} NLL" in failed
    with pytest.raises(MoecacheError, match="gate failed: .*> 5e-03"):
        gates.check(report)


def test_a_slowed_block_trips_the_throughput_gate(smoke, monkeypatch):
    """On a clock that moves 0.1 ms a read and 3 ms more in each pooled block, the pooled
    run is many times slower than the own block's, whatever the machine is doing."""
    config, model, sequences = smoke
    clock = FakeClock(tick=1e-4).install(monkeypatch, timing, pool_module)
    forward = PooledMoeBlock.forward

    def slowed(self, hidden_states):  # the same arithmetic, and 3 ms on the clock
        clock.advance(3e-3)
        return forward(self, hidden_states)

    monkeypatch.setattr(PooledMoeBlock, "forward", slowed)
    harness = {**config["harness"], "min_throughput_ratio": 0.95}
    report = gates.run(model, sequences, harness)
    assert report["throughput_ratio_pool_vs_own_block"] < 0.95
    assert any("below harness.min_throughput_ratio 0.95" in f for f in report["failures"])
    assert not any("NLL" in f for f in report["failures"])  # the arithmetic still holds
    with pytest.raises(MoecacheError, match="own block's tokens/s"):
        gates.check(report)


def test_batched_gate_fails_on_a_different_model(smoke):
    config, model, sequences = smoke
    report = gates.run(model, sequences, config["harness"])
    report["batched_nll"] += 1e-3
    assert any("batched" in f for f in gates.failures(report))
    report["runs"]["lru"]["nll"] = float("nan")
    assert any(f.startswith("lru NLL nan") for f in gates.failures(report))


def arms_of(off, config, names, multiplier=1):
    arch = config["model"]["architecture"]
    arms = []
    for name in names:
        spec = config["harness"]["runs"][name]
        capacity = spec.get("capacity", config["harness"]["capacity"])
        make = decode.policy_factory(
            spec, capacity, arch["num_experts"], arch["num_experts_per_tok"]
        )
        reads = "lru" if make().needs_future else None
        arms.append(off.arm(name, make, capacity, multiplier, reads))
    return arms


def test_interleaved_counts_repeat_and_match_one_arm_alone(smoke):
    config, model, sequences = smoke
    names = ["lru", "decayed-frequency", "dwell-4", "farthest-future"]
    with decode.offloaded(model, [1, 2], 8, "cpu", 8) as off:
        together = decode.decode(
            model, sequences, "cpu", arms_of(off, config, names), off.own, 2, repeats=2
        )
        scaled = arms_of(off, config, ["dwell-4"], multiplier=10)[0]
        scaled.name, scaled.limit = "dwell-4-x10", 2
        alone = decode.decode(
            model, sequences, "cpu", [*arms_of(off, config, ["dwell-4"]), scaled], off.own, 2
        )
    # A run at a multiplier may decode the first sequences only: the same copies there.
    assert [row["sequence"] for row in alone["dwell-4-x10"]["sequences"]] == [0, 1]
    first_two = decode_totals.totals(alone["dwell-4"]["sequences"][:2])
    assert alone["dwell-4-x10"]["totals"]["timed_copies"] == first_two["timed_copies"]
    counts = {n: (r["totals"]["fills"], r["totals"]["steady_copies"]) for n, r in together.items()}
    assert counts["dwell-4"] == (
        alone["dwell-4"]["totals"]["fills"],
        alone["dwell-4"]["totals"]["steady_copies"],
    )
    assert all(steady > 0 for _, steady in counts.values())
    assert counts["farthest-future"][1] <= counts["lru"][1]
    for result in together.values():
        assert all(len(row["step_repeats"]) == 2 for row in result["sequences"])
        low, high = result["totals"]["tokens_per_second_ci"]
        assert low <= result["totals"]["tokens_per_second"] <= high


def test_arms_take_turns_and_the_recorded_arm_goes_first():
    arms = [
        decode.Arm(name, {}, future_of="a" if name == "ff" else None)
        for name in ["ff", "b", "a", "c"]
    ]
    orders = [[arm.name for arm in decode.order(arms, turn)] for turn in range(8)]
    assert all(o[0] == "a" and sorted(o[1:]) == ["b", "c", "ff"] for o in orders)
    assert orders == [[arm.name for arm in decode.order(arms, turn)] for turn in range(8)]
    # Each arm meets more than one neighbour: no fixed rotation.
    assert len({tuple(o) for o in orders}) > 2


def test_scaled_runs_decode_token_by_token_beside_a_1x_twin(smoke, tmp_path):
    """A run at a slower link decodes its first sequences token by token beside a 1x twin
    of itself, each on its own slots; farthest-future reads the 1x LRU run's demand there.
    The twin makes the copies the 1x run made, and equation (1) predicts from it."""
    from moecache.costs import equation
    from moecache.harness import jobs

    config, model, sequences = smoke
    harness = config["harness"] | {
        "runs": {
            "lru": run_spec("lru", multipliers=[1, 10, 50]),
            "farthest-future": run_spec("farthest-future", multipliers=[1, 10]),
        },
        "scaled_sequences": 2,
    }
    gates_file = tmp_path / "gates.json"
    gates_file.write_text(json.dumps(gates_record()))
    jobs.run_decode(
        config | {"harness": harness},
        None,
        None,
        "a",
        "a",
        gates_file,
        tmp_path / "runs",
        first=3,
        loaded=(model, sequences),
    )
    runs = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*.json")}
    assert set(runs) == {
        "lru-x1",
        "lru-x10",
        "lru-x50",
        "farthest-future-x1",
        "farthest-future-x10",
    }
    assert runs["lru-x10"]["interleaved_with"] == ["lru-twin-x1", "lru-x50"]
    for label in ("lru-x10", "lru-x50", "farthest-future-x10"):
        name = runs[label]["run"]
        twin = runs[label]["twin_1x"]
        assert [r["sequence"] for r in twin["sequences"]] == [0, 1]
        one = runs[f"{name}-x1"]["sequences"][:2]
        assert [r["timed_copies"] for r in twin["sequences"]] == [r["timed_copies"] for r in one]
        assert twin["totals"]["timed_copies"] == runs[label]["totals"]["timed_copies"]
        point = equation.point(runs[label])
        assert point.twin.multiplier == 1 and point.twin.sequences == (0, 1)
        assert point.twin.step_ms == pytest.approx(twin["totals"]["step_ms"])
    # Belady copies no more than LRU on the same sequences, token by token as alone.
    ff, lru = runs["farthest-future-x10"]["totals"], runs["lru-x10"]["totals"]
    assert 0 < ff["timed_copies"] <= lru["timed_copies"]
    rows, orphans = equation.cost_rows(
        [equation.point(runs["lru-x1"], 0.01)], [equation.point(runs["lru-x10"])], {}
    )
    assert orphans == [] and rows[0]["reference"] == "twin"
    assert rows[0]["n"] == pytest.approx(runs["lru-x10"]["twin_1x"]["totals"]["copies_per_token"])


def test_arms_decoded_token_by_token_count_as_alone_and_never_two_pools(smoke):
    """The gates compare the own block with the pool token by token: each arm's NLL, copies
    and trace are what it gives decoded alone; two pooled arms (which share slots) are
    refused."""
    config, model, sequences = smoke
    ids = sequences[0][:24]
    with decode.offloaded(model, [1, 2], 16, "cpu", 8) as off:
        lru, every = arms_of(off, config, ["lru", "all"])
        base = decode.Arm("base", {})
        together = decode.decode_tokens(model, [base, every], ids, "cpu", off.own, turn=1)
        alone = {}
        for arm in (base, every):
            decode.use(model, arm, off.own)
            alone[arm.name] = decode.decode_one(model, arm, ids, "cpu")
        decode.use(model, base, off.own)
        for name in ("base", "all"):
            for key in ("nll_sum", "timed_copies", "fills", "steady"):
                assert together[name][key] == pytest.approx(alone[name][key], abs=1e-6), key
        assert together["all"]["fills"] == 2 * 16 and together["base"]["timed_copies"] == 0
        with pytest.raises(MoecacheError, match="share the slot storage"):
            decode.decode_tokens(model, [lru, every], ids, "cpu", off.own)


def test_offloaded_layers_are_put_back(smoke):
    config, model, sequences = smoke
    own = model.model.layers[1].mlp
    with decode.offloaded(model, [1], 8, "cpu", 8) as off:
        arm = arms_of(off, config, ["lru"])[0]
        decode.use(model, arm, off.own)
        assert model.model.layers[1].mlp is arm.blocks[1]
        memory = off.device_bytes()
        assert memory["slot_bytes"] == 8 * arm.blocks[1].pool.expert_bytes
        assert memory["offloaded_expert_bytes"] == 16 * arm.blocks[1].pool.expert_bytes
    assert model.model.layers[1].mlp is own


def test_a_ring_multiplier_moves_m_times_the_bytes(smoke, monkeypatch):
    config, model, sequences = smoke
    experts = model.model.layers[1].mlp.experts
    host = HostExperts(experts, 8, "cpu")
    link = SlowLink(host.first_expert(), "cpu", 1, False, 8, "ring")
    moved = []
    repeat = SlowLink.repeat
    monkeypatch.setattr(
        SlowLink, "repeat", lambda self, times: (moved.append(times), repeat(self, times))
    )
    pool = ExpertPool(host, 8, 3, link)
    pool.apply(PoolChange(admit=[5, 7]))
    assert torch.equal(host.slots["gate_up_proj"][pool.slot_of[7]], experts.gate_up_proj[7])
    assert torch.equal(host.slots["down_proj"][pool.slot_of[5]], experts.down_proj[5])
    assert moved == [2, 2] and pool.fills == 2 and pool.steady == 0 and pool.copy_seconds > 0
    assert link.at == 4  # four expert-sized blocks of the rings, each a fresh one


COPY_SECONDS = 1e-3  # what one expert copy takes on the fake clock


def copies_take(clock, monkeypatch) -> None:
    """Every expert copy of a pool moves the fake clock by COPY_SECONDS (the pool calls
    the link's `repeat` once after each real copy, whatever the link's kind)."""
    repeat = SlowLink.repeat

    def timed(self, times):
        clock.advance(COPY_SECONDS)
        repeat(self, times)

    monkeypatch.setattr(SlowLink, "repeat", timed)


def test_a_held_link_waits_m_times_the_group_and_moves_no_more_bytes(smoke, monkeypatch):
    """A held link holds a group of copies for m times its own time; no rings. On a clock
    that moves only with the copies (and a microsecond a read, so the spin ends), a group of
    two copies at 5x ends five group-times after it began."""
    config, model, sequences = smoke
    clock = FakeClock(tick=1e-6).install(monkeypatch, link_module)
    experts = model.model.layers[1].mlp.experts
    host = HostExperts(experts, 8, "cpu")
    link = SlowLink(host.first_expert(), "cpu", 1, False, 8, "hold")
    assert link.kind == "hold" and link.nbytes == 0
    started = clock.perf_counter()
    for slot, expert in ((0, 3), (1, 9)):
        host.slots["gate_up_proj"][slot].copy_(host.host["gate_up_proj"][expert])
        host.slots["down_proj"][slot].copy_(host.host["down_proj"][expert])
        clock.advance(COPY_SECONDS)
        link.repeat(4)  # nothing: a held link waits once the group is done
    link.hold(4, started)
    assert clock.now - started == pytest.approx(5 * 2 * COPY_SECONDS, rel=1e-3)
    assert torch.equal(host.slots["gate_up_proj"][0], experts.gate_up_proj[3]) and link.at == 0


def test_a_charged_link_adds_m_minus_1_times_each_group_to_the_clocks(smoke, monkeypatch):
    """On a CPU (auto) the link is charged: each group's lap is m times its real copies'
    time, the step time has the charge in it, and nothing waits it out (the link never
    spins). On a clock that moves only with the copies, 1 ms each, the sums are exact."""
    config, model, sequences = smoke
    clock = FakeClock().install(monkeypatch, timing, link_module, pool_module)
    copies_take(clock, monkeypatch)

    def spin(deadline):
        raise AssertionError("a charged link waited")

    monkeypatch.setattr(link_module, "spin_until", spin)
    host = HostExperts(model.model.layers[1].mlp.experts, 8, "cpu")
    link = SlowLink(host.first_expert(), "cpu", 1, False, 8)
    assert link.kind == "charge" and link.nbytes == 0
    pool = ExpertPool(host, 8, 5, link)
    pool.apply(PoolChange(admit=[5, 7]))
    assert pool.copy_seconds == pytest.approx(5 * 2 * COPY_SECONDS)
    assert pool.charged == pytest.approx(4 * 2 * COPY_SECONDS)
    arch = config["model"]["architecture"]
    top_k = arch["num_experts_per_tok"]
    make = decode.policy_factory(run_spec("lru"), 4, arch["num_experts"], top_k)
    with decode.offloaded(model, [0, 1], 4, "cpu", 8) as off:
        arm = off.arm("lru", make, 4, 50)
        decode.use(model, arm, off.own)
        row = decode.decode_one(model, arm, sequences[0][:48], "cpu")
        decode.use(model, decode.Arm("own", {}), off.own)
    charged = sum(block.pool.charged for block in arm.blocks.values())
    copied = row["timed_copies"] * COPY_SECONDS  # the real copies' time at the timed tokens
    assert row["steady"] > 0 and charged == pytest.approx(49 * copied)
    assert row["copy_seconds"] == pytest.approx(50 * copied)
    # The compute took no time on this clock: each step is its copies, charge included.
    assert row["step_seconds"] == pytest.approx(50 * copied)


def test_a_host_clock_link_is_refused_on_cuda():
    for kind in ("hold", "charge"):
        with pytest.raises(MoecacheError, match="use ring"):
            link_kind(kind, "cuda")
    assert link_kind("auto", "cuda") == "ring" and link_kind("auto", "cpu") == "charge"


@pytest.mark.parametrize("kind", ["charge", "hold"])
def test_bandwidth_prices_a_multiplier_as_a_slower_link(smoke, monkeypatch, kind):
    """On a clock where each expert copy takes 1 ms (and a read 1 us, so spins end), a link
    10 times slower, charged or held, measures tau(10) = 10 tau(1) = 10 ms; ignoring the
    multiplier would give 1 ms. (A ring's repeats are counted in
    test_a_ring_multiplier_moves_m_times_the_bytes: its time is the machine's own.)"""
    config, model, sequences = smoke
    clock = FakeClock(tick=1e-6)
    clock.install(monkeypatch, timing, link_module, pool_module, bandwidth)
    copies_take(clock, monkeypatch)
    experts = model.model.layers[1].mlp.experts
    report = bandwidth.measure([experts], "cpu", [1, 10], ring_mib=64, rounds=2, link=kind)
    assert report["tau_ms"] == pytest.approx(1.0, rel=0.01) and report["link"] == kind
    assert report["multipliers"]["10"]["tau_ms"] == pytest.approx(10.0, rel=0.01)
    assert report["multipliers"]["10"]["ratio_to_1x"] == pytest.approx(10.0, rel=0.02)


@pytest.mark.parametrize("implementation", ["per-expert", "grouped_mm", "eager"])
@torch.inference_mode()
def test_pooled_block_runs_the_models_own_kernel(smoke_run, implementation):
    """At C = N, the pooled block gives the own block's outputs with any expert kernel."""
    arch = load_yaml(SMOKE)["model"]["architecture"]
    model = checkpoint.load(smoke_run / "results/model", "float32", "cpu", arch, implementation)
    x = torch.randn(1, 1, arch["hidden_size"], generator=torch.Generator().manual_seed(0))
    own = model.model.layers[1].mlp
    expected = own(x)
    with decode.offloaded(model, [1], 16, "cpu", 8) as off:
        make = decode.policy_factory(run_spec("all"), 16, 16, arch["num_experts_per_tok"])
        block = off.arm("all", make, 16).blocks[1]
        block.reset()
        assert torch.allclose(block(x), expected, atol=1e-6)


@torch.inference_mode()
def test_per_expert_kernel_equals_transformers_grouped_kernel(smoke_run):
    arch = load_yaml(SMOKE)["model"]["architecture"]
    outputs = []
    for implementation in ("per-expert", "grouped_mm"):
        model = checkpoint.load(smoke_run / "results/model", "float32", "cpu", arch, implementation)
        x = torch.randn(1, 7, arch["hidden_size"], generator=torch.Generator().manual_seed(1))
        outputs.append(model.model.layers[2].mlp(x))
    assert torch.allclose(*outputs, atol=1e-6)


def test_link_check_from_the_pipeline(smoke_run):
    """The link check decodes LRU at 1x and at the largest multiplier under every CPU link:
    each prices a copy well above its 1x time, and the runs' counts are LRU's alike."""
    report = read_dict(smoke_run / "results/link/cpu.json", LinkCheckResult)
    runs = {row["run"]: row for row in report["runs"]}
    assert report["multiplier"] == 10 and report["policy"] == "lru"
    assert list(runs) == ["1x", "charge 10x", "hold 10x", "ring 10x"]
    assert runs["1x"]["compute_ratio_to_1x"] == 1 and runs["1x"]["link"] is None
    for name in ("charge 10x", "hold 10x", "ring 10x"):
        assert runs[name]["multiplier"] == 10 and runs[name]["tau_ratio_to_1x"] > 3
        assert runs[name]["copies_per_token"] == runs["1x"]["copies_per_token"]
        assert runs[name]["compute_ms"] > 0


def test_decode_results_from_the_pipeline(smoke_run):
    config = load_settings(SMOKE)
    runs = config["harness"]["runs"]
    decoded = {json.loads(p.read_text())["policy"] for p in smoke_run.glob("results/runs/*/*")}
    # Every policy runs closed loop, and the zoo's best two in replay (each zoo
    # rule's harness path equals its replay: tests/test_zoo.py); learned scorers decode in
    # the learned stage's own closed-loop job (tests/test_learned.py).
    # The oracle set runs in the accuracy stage (tests/test_accuracy.py). The causal rules
    # decode in the learned closed-loop job where learned.causal.closed_loop names a shard
    # (the embedded default's config; the smoke config has no causal part), and here in
    # test_the_causal_rules_decode_closed_loop_as_they_replay.
    causal = {"co-activation", "reuse-distance", "next-use"}
    closed_loop = set(POLICIES) - set(ZOO) - {"learned", "oracle-set"} - causal
    assert decoded == closed_loop | {"lfu", "s3-fifo"}
    closed = smoke_run.glob("results/learned/closed-loop/*/*.json")
    assert {json.loads(p.read_text())["policy"] for p in closed} == {"learned"}
    for shard in config["corpus"]["heldout"]["shards"]:
        report = read_dict(smoke_run / f"results/gates/{shard}.json", GatesResult)
        assert report["failures"] == [] and report["runs"].keys() == {
            "lru",
            "dwell-1-window-1",
            "all-resident",
        }
    lru = json.loads((smoke_run / "results/runs/a/lru-x1.json").read_text())
    lru10 = json.loads((smoke_run / "results/runs/a/lru-x10.json").read_text())
    ff = json.loads((smoke_run / "results/runs/a/farthest-future-x1.json").read_text())
    assert lru["totals"]["delta_nll"] == pytest.approx(0, abs=gates.POOL_TOLERANCE)
    assert lru10["totals"]["steady_copies"] == lru["totals"]["steady_copies"]
    assert ff["totals"]["steady_copies"] <= lru["totals"]["steady_copies"]
    assert len(lru["sequences"]) == config["corpus"]["heldout"]["sequences"]
    assert lru["versions"]["torch"] and lru["settings"]["harness"]["runs"] == runs
    trace = pd.read_parquet(smoke_run / "results/traces/a/lru-x1.parquet")
    assert list(trace.columns) == [
        "sequence",
        "layer",
        "token",
        "requested",
        "used",
        "copied",
        "refreshed",
        "decide_seconds",
        "probs",
    ]
    assert set(trace["layer"]) == set(config["harness"]["restricted_layers"])
    assert trace["probs"].map(len).eq(config["model"]["architecture"]["num_experts"]).all()
    assert (trace["requested"].map(sorted) == trace["used"].map(sorted)).all()  # lossless
    probe = read_dict(smoke_run / "results/probe/a.json", ProbeResult)
    assert len(probe["layers"]) == config["model"]["architecture"]["num_hidden_layers"]
    bandwidth = read_dict(smoke_run / "results/bandwidth/cpu.json", BandwidthResult)
    assert bandwidth["tau_ms"] > 0 and bandwidth["large_gib_per_s"] > 0


def test_the_causal_rules_decode_closed_loop_as_they_replay(smoke, tmp_path):
    """Co-activation, reuse-distance, decayed frequency and next-use (a random model per
    layer; it reads its layer, which the harness sets) decode in the harness, interleaved;
    each one's copies, sequence by sequence, equal its replay of the demand it met."""
    from test_next_use import model_file

    from moecache.learned import causal
    from moecache.records import trace as traces
    from moecache.records.trace import read_demand

    config, model, sequences = smoke
    arch = config["model"]["architecture"]
    n, k, capacity, layers = arch["num_experts"], arch["num_experts_per_tok"], 8, [1, 2]
    weights = model_file(tmp_path, n, layers=tuple(layers))
    rules = {
        "co-activation": {"decay": 0.99, "context_decay": 0.5},
        "reuse-distance": {"weight": 0.15, "prior": 64.0, "overdue": 1.0},
        "decayed-frequency": {"decay": 0.98},
        "next-use": {"weights": weights, "frequency": 0.3, "coactivation": 0.5},
    }
    with decode.offloaded(model, layers, capacity, "cpu", 8) as off:
        arms = [
            off.arm(name, decode.policy_factory(run_spec(name, p), capacity, n, k), 8)
            for name, p in rules.items()
        ]
        results = decode.decode(model, sequences[:2], "cpu", arms, off.own, 2)
    for name, params in rules.items():
        result = results[name]
        assert abs(result["totals"]["nll"] - results["co-activation"]["totals"]["nll"]) < 1e-5
        path = tmp_path / f"{name}.parquet"
        traces.write(result["trace"], path, {"run": name})
        replay = causal.copies(read_demand(path, n), causal.rule_text(name, params), capacity)
        loop = {f"seq{r['sequence']}": r["fills"] + r["steady"] for r in result["sequences"]}
        assert loop == replay and sum(loop.values()) > 2 * capacity * len(layers), name


def decode_args(smoke_run, tmp_path, settings, shard="a"):
    return moecache(
        "decode",
        "--settings",
        json.dumps(settings),
        "--model",
        str(smoke_run / "results/model"),
        "--sequences",
        str(smoke_run / f"results/heldout/{shard}.parquet"),
        "--shard",
        shard,
        "--gates",
        str(smoke_run / f"results/gates/{shard}.json"),
        "--out-dir",
        str(tmp_path / "out"),
    )


def test_a_shard_plans_its_runs_at_1x_and_the_first_shard_every_multiplier(smoke_config):
    from moecache.harness import runs

    smoke_config["harness"]["runs"] = {
        "lru": run_spec("lru", multipliers=[1, 10, 50]),
        "ff": run_spec("farthest-future", capacity=12, multipliers=[1, 10]),
        "lfu": run_spec("lfu", shards=["b"]),
    }
    first = runs.runs_for_shard(smoke_config, "a", "a")
    assert list(first) == ["lru-x1", "lru-x10", "lru-x50", "ff-x1", "ff-x10"]
    ff = first["ff-x10"]
    assert (ff.name, ff.multiplier, ff.capacity, ff.reads) == ("ff", 10, 12, "lru-x1")
    assert first["lru-x10"].reads is None and first["lru-x10"].capacity == 8
    assert first["ff-x1"].make() is not first["ff-x1"].make()  # a fresh policy per arm
    assert runs.interleaved_with(first, "lru-x1") == ["ff-x1"]
    assert runs.interleaved_with(first, "lru-x10") == ["lru-twin-x1", "lru-x50"]
    assert list(runs.runs_for_shard(smoke_config, "b", "a")) == ["lru-x1", "ff-x1", "lfu-x1"]


def test_decode_refuses_bad_input_in_one_line(smoke_run, tmp_path):
    config = load_settings(SMOKE)
    settings = {k: config[k] for k in ("seed", "hub_offline", "model", "harness")}
    runs = settings["harness"]["runs"]
    cases = [
        (
            "c",
            {"lru": run_spec("lru", shards=["a"])},
            "shard c: no run of harness.runs decodes it",
        ),
        (
            "a",
            {"lru": run_spec("lru", shards=["b"]), "ff": run_spec("farthest-future")},
            "run ff: reads the demand of lru at 1x, which shard a does not decode",
        ),
    ]
    for shard, new_runs, message in cases:
        runs.clear()
        runs.update(new_runs)
        result = decode_args(smoke_run, tmp_path, settings, shard)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0]
        assert list(tmp_path.iterdir()) == []


def test_bad_policy_parameters_in_config(smoke_config):
    from moecache import config as configs

    runs = smoke_config["harness"]["runs"]
    cases = [
        (run_spec("lru", capacity=17), "capacity 17 <= experts 16"),
        (run_spec("lru", capacity=3), "top-k 4 <= capacity 3"),
        (run_spec("belady"), "unknown policy 'belady'"),
        (run_spec("dwell", {"k": 4, "dwell": 2}), "unknown parameter 'dwell'"),
        (run_spec("dwell", {"k": 0}), "k 0 and window 0 must be >= 1"),
    ]
    for spec, message in cases:
        runs["bad"] = spec
        with pytest.raises(configs.ConfigError, match="harness.runs.bad: .*" + message):
            configs.validate(smoke_config)
    runs.pop("bad")
    smoke_config["harness"]["trace_run"] = "dwell-4"
    with pytest.raises(configs.ConfigError, match="harness.trace_run: 'dwell-4' restricts routing"):
        configs.validate(smoke_config)
