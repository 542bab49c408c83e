"""The overlap cost model (costs/overlap.py) and the scaled runs' cut sequences."""

import pytest

from moecache.config import run_spec
from moecache.costs import overlap
from moecache.errors import MoecacheError
from moecache.harness.runs import cut_demand, scaled_sequences


def test_the_model_adds_demand_stall_and_the_prefetches_the_window_does_not_hide():
    # c + sum over groups (d, j, per token) of max(0, d tau - j e) + max(0, n_p tau - A)
    assert overlap.predict(5.0, 1.0, [(10, 0, 1.0)], 0.5, 0, 3.0) == 15.0
    assert overlap.predict(5.0, 1.0, [(6, 0, 1.0)], 0.5, 8, 3.0) == 5.0 + 6.0 + 5.0
    assert overlap.predict(5.0, 0.1, [(2, 0, 1.0)], 0.5, 8, 3.0) == pytest.approx(5.2)


def test_a_layers_experts_computed_before_its_last_copy_hide_its_copies():
    # Two copies, three experts computed first at 0.5 ms: 1.5 of the 2 ms hidden, at half
    # the tokens; at 0.1 ms a copy all hidden; a group with nothing before hides nothing.
    groups = [(2, 3, 0.5), (1, 0, 1.0)]
    assert overlap.predict(5.0, 1.0, groups, 0.5, 0, 3.0) == 5.0 + 0.5 * 0.5 + 1.0
    assert overlap.predict(5.0, 0.1, groups[:1], 0.5, 0, 3.0) == 5.0


def seq(step, copies, copy_s=0.0, demand=0, prefetch=0, used=0, stall=0.0, hidden=0.0, block=0.0):
    return {
        "sequence": 0, "timed_tokens": 10, "step_seconds": step, "copy_seconds": copy_s,
        "timed_copies": copies, "demand_copies": demand, "prefetch_copies": prefetch,
        "prefetch_used": used, "stall_seconds": stall, "hidden_copy_seconds": hidden,
        "block_seconds": block,
    }  # fmt: skip


def run(name, m, rows, overlap=True, twin=None, ms=1.0, accuracy=None):
    return {
        "run": name, "policy": "lru", "params": {}, "overlap": overlap, "prefetch": "pregate",
        "multiplier": m, "shard": "a", "sequences": rows, "twin_1x": twin,
        "totals": {"step_ms": ms, "step_ms_ci": [ms, ms], "prefetch_accuracy": accuracy},
    }  # fmt: skip


def test_the_model_reproduces_the_1x_step_and_predicts_a_slower_link_from_its_copies():
    blocking = run("lru", 1, [seq(0.06, 100, copy_s=0.01)], overlap=False)
    blocking10 = run("lru", 10, [seq(0.15, 100)], overlap=False, twin=blocking)
    counts = {"demand": 80, "prefetch": 40, "used": 20}
    one_rows = [seq(0.07, 0, **counts, stall=0.004, hidden=0.008, block=0.04)]
    one = run("lru-overlap", 1, one_rows, ms=7.0, accuracy=0.5)
    slow_rows = [seq(0.2, 0, **counts, stall=0.1, hidden=0.02, block=0.17)]
    slow = run("lru-overlap", 10, slow_rows, twin=one, ms=20.0, accuracy=0.5)
    rows = overlap.model_rows([blocking, blocking10, one, slow])
    assert [r["multiplier"] for r in rows] == [1, 10]
    assert rows[0]["predicted_ms"] == pytest.approx(7.0)  # exact at 1x, as equation (1)
    # tau(10) = 0.12 s / 120 copies = 1 ms; n = 10 per token, n_p = 4, a = 0.5, A = 3 ms.
    stall_1x = (10 - 2) * 0.1 + max(0.0, 4 * 0.1 - 3.0)
    expected = (7.0 - stall_1x) + (10 - 2) * 1.0 + max(0.0, 4 * 1.0 - 3.0)
    assert rows[1]["predicted_ms"] == pytest.approx(expected)
    assert rows[1]["within_10pct"] == (abs(expected / 20.0 - 1) <= 0.10)


def test_the_model_reads_the_demand_groups_and_the_expert_compute_the_harness_counted():
    blocking = run("lru", 1, [seq(0.06, 100, copy_s=0.01)], overlap=False)
    blocking10 = run("lru", 10, [seq(0.15, 100)], overlap=False, twin=blocking)
    # 40 layer-tokens of 2 demand copies, each after 3 experts; 320 experts computed.
    counts = {"demand": 80, "prefetch": 40, "used": 20}
    grouped = {"demand_groups": [[2, 3, 40]], "experts_computed": 320}
    one_rows = [{**seq(0.07, 0, **counts, stall=0.004, hidden=0.008, block=0.04), **grouped}]
    one = run("lru-overlap", 1, one_rows, ms=7.0, accuracy=0.5)
    slow_rows = [{**seq(0.2, 0, **counts, stall=0.1, hidden=0.02, block=0.17), **grouped}]
    slow = run("lru-overlap", 10, slow_rows, twin=one, ms=20.0, accuracy=0.5)
    rows = overlap.model_rows([blocking, blocking10, one, slow])
    e = 1e3 * (0.04 - 0.004) / 320  # ms an expert
    assert rows[0]["expert_ms"] == pytest.approx(e)
    assert rows[0]["predicted_ms"] == pytest.approx(7.0)  # 1x: every copy hidden (0.2 < 3e)
    # tau(10) = 1 ms: 4 groups a token, each 2 ms of copies less 3e hidden; 4 - 3 ms prefetch.
    assert rows[1]["predicted_ms"] == pytest.approx(7.0 + 4 * (2.0 - 3 * e) + 1.0)


def test_an_overlapped_run_without_its_blocking_run_is_refused_in_one_line():
    one = run("lru-overlap", 1, [seq(0.07, 0, demand=8, block=0.04)], ms=7.0)
    with pytest.raises(MoecacheError, match="needs the blocking run of policy lru at 1x"):
        overlap.model_rows([one])
    assert overlap.model_rows([one], strict=False) == []


def test_scaled_runs_decode_the_first_sequences_cut_and_read_a_future_cut_alike():
    sequences = [list(range(10)), list(range(5)), list(range(7))]
    harness = {"scaled_sequences": 2, "scaled_tokens": 6}
    cut = scaled_sequences(harness, sequences)
    assert cut == [list(range(6)), list(range(5))]
    assert scaled_sequences({}, sequences) == sequences
    demand = {s: {0: [[s, t] for t in range(len(ids))]} for s, ids in enumerate(sequences)}
    assert {s: len(layers[0]) for s, layers in cut_demand(demand, cut).items()} == {0: 6, 1: 5}


def test_a_lossless_run_that_leaves_the_base_nll_fails_its_decode_job():
    from types import SimpleNamespace

    from moecache.harness.runs import RunSpec, refuse_lossy_lossless

    def spec(name, restricts):
        make = lambda: SimpleNamespace(restricts=restricts)  # noqa: E731
        return RunSpec(name, {}, 4, 1, None, make)

    runs = {"lru-overlap-x1": spec("lru-overlap", False), "dwell-x1": spec("dwell", True)}
    results = {"lru-overlap-x1": {"totals": {"delta_nll": 0.0}}}
    results["dwell-x1"] = {"totals": {"delta_nll": 0.2}}  # restricting: allowed to
    refuse_lossy_lossless(runs, results)
    results["lru-overlap-x1"]["totals"]["delta_nll"] = 0.01
    with pytest.raises(MoecacheError, match="run lru-overlap-x1: lossless, but its NLL left"):
        refuse_lossy_lossless(runs, results)


def test_a_prefetch_under_a_rule_that_ranks_only_inside_its_kernel_is_refused():
    from moecache.harness import decode
    from moecache.harness.overlapped_block import refuse_unranked

    lfu = decode.policy_factory(run_spec("lfu"), 4, 8, 2)()
    lru = decode.policy_factory(run_spec("lru"), 4, 8, 2)()
    refuse_unranked("pregate", lru)
    refuse_unranked("none", lfu)
    with pytest.raises(MoecacheError, match="prefetch pregate: needs a lossless eviction rule"):
        refuse_unranked("pregate", lfu)
