"""Trace replay, bounds and the exact optimum on generated streams.

Replay steps many streams at once; the harness drives one stream through Policy.change. The
property tests here check that both give the same counts for every lossless rule, that
every lossless invariant holds, that B_flat <= exact optimum <= greedy <= LRU, and that
on single requests LRU and farthest future equal libCacheSim's LRU and Belady.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import moecache
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_policies import LOSSLESS, router_probs, simulate

from moecache.errors import MoecacheError
from moecache.policies import POLICIES, ZOO, EvictionPolicy, make
from moecache.policies.farthest_future import next_requests
from moecache.records.demand import Demand, from_arrays, padded, read_jsonl
from moecache.records.io import read_dict
from moecache.records.replay import ReplayBenchmark
from moecache.replay import bound, engine, optimum, reference

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def demands(draw, max_experts=12, max_streams=5, max_len=40, top_k=(1, 3), probs=False):
    """Several streams of different lengths over one layer shape, and a capacity."""
    k = draw(st.integers(*top_k))
    n = draw(st.integers(max(2, k), max_experts))
    capacity = draw(st.integers(k, n))
    hot = draw(st.integers(k, n))  # ids from a hot set, so that hits happen
    request = st.lists(st.sampled_from(range(hot)), min_size=k, max_size=k, unique=True)
    streams = draw(
        st.lists(st.lists(request, min_size=1, max_size=max_len), min_size=1, max_size=max_streams)
    )
    requests, lengths = padded([np.array(s) for s in streams], k)
    names = [f"s{i}" for i in range(len(streams))]
    table = None
    if probs:
        seed = draw(st.integers(0, 2**32 - 1))
        table = np.zeros((*requests.shape[:2], n), dtype=np.float32)
        for i, stream in enumerate(streams):
            table[i, : len(stream)] = router_probs(n, stream, seed + i)
    return Demand(names, names, requests, lengths, n, table), streams, capacity


def rule_text(name: str, params: dict) -> str:
    return name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")


@SETTINGS
@given(demands(probs=True))
def test_replay_equals_the_harness_path_for_every_rule(case):
    """All streams stepped together give each stream's counts of the one-stream path the
    pooled block takes (Policy.change), fills and steady split included."""
    demand, streams, capacity = case
    for name, params in LOSSLESS:
        counts = engine.run(demand, engine.make_rule(rule_text(name, params), demand, capacity))
        for i, stream in enumerate(streams):
            policy = make(name, capacity, demand.num_experts, demand.top_k, params)
            probs = list(demand.probs[i, : len(stream)].astype(float))
            single = simulate(policy, stream, probs)
            got = (counts.insertions[i], counts.fills[i], counts.steady[i])
            assert got == (single.insertions, single.fills, single.steady), (name, params, i)


@SETTINGS
@given(demands(probs=True))
def test_every_lossless_invariant_holds(case):
    """Per token: all requested experts resident, victims never requested by that token and
    resident before it, nothing above capacity, copies only of misses."""
    demand, _, capacity = case
    for name, params in LOSSLESS:
        counts = engine.run(
            demand, engine.make_rule(rule_text(name, params), demand, capacity), keep=True
        )
        for s, length in enumerate(demand.lengths):
            before = np.zeros(demand.num_experts, dtype=bool)
            copies = 0
            for t in range(length):
                request = demand.requests[s, t]
                after, evicted = counts.residents[s, t], counts.evictions[s, t]
                assert after[request].all(), (name, s, t)
                assert not evicted[request].any(), (name, s, t)
                assert (before | ~evicted).all() and not (after & evicted).any(), (name, s, t)
                assert after.sum() <= capacity
                admitted = after & ~before
                assert set(np.flatnonzero(admitted)) <= set(request), (name, s, t)
                assert (after == ((before & ~evicted) | admitted)).all()
                # Evict only to make room: a pool below capacity never lost an expert.
                assert not evicted.any() or after.sum() == capacity
                copies += admitted.sum()
                before = after
            assert copies == counts.insertions[s]


@settings(max_examples=80, deadline=None)
@given(demands(max_experts=9, max_len=14))
def test_bounds_sandwich_the_exact_optimum(case):
    """B_flat <= B* (exact, prefetching allowed) <= greedy farthest future <= LRU; B* from
    the LP equals B* from the DP."""
    demand, _, capacity = case
    flat, _ = bound.flat_bound(demand, capacity)
    best = bound.exact(demand, capacity)
    np.testing.assert_array_equal(best, bound.dp(demand, capacity))
    greedy = bound.farthest_future(demand, capacity)
    lru = engine.run(demand, make("lru", capacity, demand.num_experts, demand.top_k, {}))
    assert (flat <= best).all() and (best <= greedy).all()
    assert (greedy <= lru.after_fill).all()
    assert (best >= 0).all()


@settings(max_examples=40, deadline=None)
@given(demands(max_experts=20, max_len=80, top_k=(1, 1)))
def test_single_requests_equal_libcachesim(case):
    """With one request per token the replay's LRU and farthest future are classical LRU
    and MIN: the same misses as libCacheSim's LRU and Belady."""
    demand, _, capacity = case
    for rule in ("lru", "farthest-future"):
        ours = engine.run(demand, engine.make_rule(rule, demand, capacity)).insertions.sum()
        theirs = reference.misses(demand, capacity, rule)
        assert ours == theirs, rule


def test_libcachesim_agrees_on_a_paper_shaped_stream():
    """The same check on a long bursty stream of many single-request streams."""
    rng = np.random.default_rng(3)
    demand = from_arrays(optimum.generate(rng, "bursty", 24, 500, 64, 1), 64)
    for rule in ("lru", "farthest-future"):
        ours = engine.run(demand, engine.make_rule(rule, demand, 16)).insertions.sum()
        assert ours == reference.misses(demand, 16, rule)


@settings(max_examples=60, deadline=None)
@given(demands(max_experts=10, max_len=25))
def test_next_requests_table(case):
    """after[t, s, j]: the next token at which request j of token t comes again; first: the
    first token that requests each expert (never = T + 1)."""
    demand, streams, _ = case
    after, first, never = next_requests(demand.requests, demand.num_experts)
    for s, stream in enumerate(streams):
        for e in range(demand.num_experts):
            uses = [t for t, r in enumerate(stream) if e in r]
            assert first[s, e] == (uses[0] if uses else never)
        for t, request in enumerate(stream):
            for j, e in enumerate(request):
                later = [u for u in range(t + 1, len(stream)) if e in stream[u]]
                assert after[t, s, j] == (later[0] if later else never)


def test_greedy_above_lru_would_be_reported_not_hidden():
    """Gap shares: 1 for the oracle, 0 for LRU, undefined when they tie."""
    assert engine.gap_recovered(10, 4, 4) == 1.0
    assert engine.gap_recovered(10, 4, 10) == 0.0
    assert engine.gap_recovered(10, 4, 7) == 0.5
    assert engine.gap_recovered(5, 5, 5) is None


def test_hand_checked_streams():
    """C=2, one request per token: A B A B costs 2 (both fill); A A B B C C: 3 fills of
    which C's evicts, so 1 copy after the first C = 2."""
    demand = from_arrays(np.array([[[0], [1], [0], [1]], [[0], [0], [1], [1]]]), 4)
    counts = engine.run(demand, make("lru", 2, 4, 1, {}))
    assert counts.insertions.tolist() == [2, 2]
    third = from_arrays(np.array([[[0], [0], [1], [1], [2], [2]]]), 4)
    counts = engine.run(third, make("lru", 2, 4, 1, {}))
    assert (counts.insertions[0], counts.after_fill[0], counts.steady[0]) == (3, 1, 1)


def test_sweep_reports_greedy_against_the_optimum():
    from moecache.replay import sweep

    settings_ = {"instances": 90, "tokens": [4, 8], "shapes": [[6, 3, 1], [8, 6, 2]]}
    report = sweep.run(settings_, seed=1)
    assert report["instances"] >= 90
    assert sum(c["instances"] for c in report["cells"]) == report["instances"]
    assert {c["kind"] for c in report["cells"]} == set(optimum.KINDS)
    assert report["greedy_not_optimal"] == len(report["not_optimal_instances"])
    assert report["lp_dp_disagreements"] == 0
    # k = 1: greedy is Belady, optimal on every instance.
    k1 = [c for c in report["cells"] if c["top_k"] == 1]
    assert all(c["greedy_optimal"] == c["instances"] for c in k1)


def test_sweep_fails_loudly_when_the_sandwich_breaks(monkeypatch):
    """A broken bound (one above the optimum) stops the sweep with the instance."""
    from moecache.replay import sweep

    def too_high(demand, capacity):
        return np.full(len(demand.streams), 10**6), []

    monkeypatch.setattr(bound, "flat_bound", too_high)
    with pytest.raises(MoecacheError, match="B_flat .* fails"):
        sweep.run({"instances": 9, "tokens": [6, 6], "shapes": [[6, 2, 1]]}, seed=0)


def test_sweep_fails_loudly_when_the_lp_and_the_dp_disagree(monkeypatch):
    """A broken DP (too few insertions) stops the sweep with the instance."""
    from moecache.replay import sweep

    monkeypatch.setattr(optimum, "exact_insertions", lambda r, n, c: np.full(len(r), 2))
    with pytest.raises(MoecacheError, match="the LP gives .*, the DP"):
        sweep.run({"instances": 9, "tokens": [6, 6], "shapes": [[6, 2, 1]]}, seed=0)


# --- files and the command line ----------------------------------------------------------


def write_lines(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


STREAMS = [
    {"stream": "a", "tokens": [[0, 1], [2, 3], [0, 2], [1, 3], [4, 5], [0, 1]]},
    {"stream": "b", "tokens": [[5, 1], [2, 3], [0, 2]]},
]


def test_jsonl_demand_reads_streams(tmp_path):
    demand = read_jsonl(write_lines(tmp_path / "d.jsonl", STREAMS), 6)
    assert demand.streams == ["a", "b"] and demand.lengths.tolist() == [6, 3]
    assert demand.requests[1, 3:].tolist() == [[-1, -1]] * 3
    assert demand.timed_tokens == 5 + 2


@pytest.mark.parametrize(
    "rows, extra, message",
    [
        ([{"stream": "a", "tokens": [[0, -1]]}], [], "expert -1, outside 0..5"),
        ([{"stream": "a", "tokens": [[0, 6]]}], [], "expert 6, outside 0..5"),
        ([{"stream": "a", "tokens": [[0, 1], [2]]}], [], "ragged demand"),
        ([{"stream": "a", "tokens": [[0, 1]]}, {"stream": "b", "tokens": [[1]]}], [], "ragged"),
        (
            [{"stream": "a", "tokens": [[0, 1, 2, 3]]}],
            [],
            "top-k 4 is larger than capacity 3",
        ),
        ([{"stream": "a", "tokens": [[1, 1]]}], [], "requests an expert twice"),
        ([{"stream": "a"}], [], 'keys "stream" and "tokens"'),
        ([{"stream": "a", "tokens": [[0.5]]}], [], "lists of ints"),
        ([{"stream": "a", "tokens": [[0]]}, {"stream": "a", "tokens": [[1]]}], [], "twice"),
        (STREAMS, ["--rule", "dwell"], "not a lossless eviction rule"),
        (STREAMS, ["--rule", "router-logit"], "needs router probabilities"),
        (STREAMS, ["--rule", "belady"], "unknown policy 'belady'"),
        (STREAMS, ["--rule", "farthest-future:foresight=0"], "foresight 0 must be >= 1"),
    ],
)
def test_bad_demand_is_one_line(tmp_path, rows, extra, message):
    path = write_lines(tmp_path / "d.jsonl", rows)
    out = tmp_path / "out.json"
    for command in (["replay", *extra], ["bound"], ["optimum"]):
        if extra and command[0] != "replay":
            continue
        result = moecache(
            *command, "--demand", str(path), "--experts", "6", "--capacity", "3", "--out", str(out)
        )
        assert result.returncode == 2, (command, result.stdout)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (command, result.stderr)
        assert not out.exists()


def test_malformed_json_names_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"stream": "a", "tokens": [[0]]}\n{"stream": \n')
    result = moecache("replay", "--demand", str(path), "--experts", "4", "--capacity", "2")
    assert result.returncode == 2 and f"{path}:2: not JSON" in result.stderr


def test_replay_json_schema(tmp_path):
    """--json prints the documented report; --out writes the same."""
    path = write_lines(tmp_path / "d.jsonl", STREAMS)
    out = tmp_path / "r.json"
    result = moecache(
        "replay",
        "--demand",
        str(path),
        "--experts",
        "6",
        "--capacity",
        "3",
        "--json",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report == json.loads(out.read_text())
    assert set(report) >= {
        "capacity",
        "experts",
        "top_k",
        "streams",
        "tokens",
        "timed_tokens",
        "rules",
        "inputs",
        "versions",
    }
    # Every lossless rule in the registry that needs no router probabilities (a demand file
    # has none) and no trained file (those run only when named); the references among them.
    expected = {
        name
        for name, cls in POLICIES.items()
        if issubclass(cls, EvictionPolicy) and cls.by_default and not cls.needs_probs
    }
    assert {"lru", "farthest-future", *ZOO} <= expected
    assert not {"router-logit", "learned", "dwell"} & expected
    assert set(report["rules"]) == expected
    lru = report["rules"]["lru"]
    assert set(lru["totals"]) == {
        "insertions",
        "fills",
        "steady",
        "after_fill",
        "copies_per_token",
        "gap_recovered",
    }
    assert [s["stream"] for s in lru["streams"]] == ["a", "b"]
    assert sum(s["steady"] for s in lru["streams"]) == lru["totals"]["steady"]
    assert report["rules"]["farthest-future"]["totals"]["gap_recovered"] == 1.0
    assert report["inputs"][0]["path"] == str(path)


def test_optimum_and_bound_commands(tmp_path):
    path = write_lines(tmp_path / "d.jsonl", STREAMS)
    args = ["--demand", str(path), "--experts", "6", "--capacity", "3", "--json"]
    exact = json.loads(moecache("optimum", *args, check=True).stdout)
    mixed = ["--mixed-share", "0.5", "--mixed-cost", "0.25", "--seed", "3"]
    bounds = json.loads(moecache("bound", *args, *mixed, check=True).stdout)
    t = exact["totals"]
    assert t["b_flat"] <= t["optimum"] <= t["b_greedy"]
    assert t["dp"] == t["optimum"] and t["integral"] and t["certified"]
    assert all(s["dp"] == s["optimum"] for s in exact["streams"])
    b = bounds["totals"]
    assert (b["b_greedy"], b["b_flat"], b["b_star"]) == (t["b_greedy"], t["b_flat"], t["optimum"])
    assert set(b["tightest_order_counts"]) == set(bound.ORDERS)
    assert b["greedy_optimal"] and b["greedy_optimal_share"] == 1.0 and b["integral"]
    assert b["greedy_minus_b_star"] == 0 and b["lp_seconds"] >= 0
    assert [s["b_star"] for s in bounds["streams"]] == [s["optimum"] for s in exact["streams"]]
    m = bounds["mixed_precision"]
    assert (m["share"], m["cost"], m["seed"], m["low_precision_experts"]) == (0.5, 0.25, 3, 3)
    assert m["totals"]["lp"] <= min(m["totals"]["farthest_future"], m["totals"]["cheapest"])
    assert m["totals"]["lp"] == sum(s["lp"] for s in m["streams"])
    plain = json.loads(moecache("bound", *args, check=True).stdout)
    assert plain["mixed_precision"] is None


# --- the smoke run -----------------------------------------------------------------------


def test_replay_agrees_with_the_closed_loop_harness(smoke_run):
    """Replaying the trace run's demand gives every lossless run's closed-loop fills and
    steady copies exactly, at every copy multiplier."""
    from conftest import SMOKE, load_yaml

    from moecache.records.trace import read_demand as read_trace

    config = load_yaml(SMOKE)
    harness = config["harness"]
    checked = 0
    for shard in config["corpus"]["heldout"]["shards"]:
        trace = smoke_run / f"results/traces/{shard}/{harness['trace_run']}-x1.parquet"
        demand = read_trace(trace)
        pipeline = json.loads((smoke_run / f"results/replay/{shard}/replay.json").read_text())
        for name, run in harness["runs"].items():
            if not issubclass(POLICIES[run["policy"]], EvictionPolicy):
                continue
            if run.get("overlap") and run.get("prefetch", "none") != "none":
                continue  # its prefetches are insertions the replay of its rule never makes
            for path in sorted((smoke_run / "results/runs" / shard).glob(f"{name}-x*.json")):
                closed = json.loads(path.read_text())["totals"]
                rule = rule_text(run["policy"], run.get("params", {}))
                capacity = run.get("capacity", harness["capacity"])
                totals = engine.report(demand, capacity, [rule])["rules"][rule]["totals"]
                got = (totals["fills"], totals["steady"])
                assert got == (closed["fills"], closed["steady_copies"]), path.name
                assert totals["copies_per_token"] == pytest.approx(closed["rho"])
                if rule in pipeline["rules"]:
                    assert pipeline["rules"][rule]["totals"] == totals
                checked += 1
    assert checked >= 8  # lru (x1, x10), farthest-future on both shards, and the rest on a


def test_replay_outputs_of_the_pipeline(smoke_run):
    """Bounds, foresight, the sweep and the benchmark, as the pipeline wrote them."""
    from conftest import SMOKE, load_yaml

    config = load_yaml(SMOKE)
    results = smoke_run / "results/replay"
    for shard in config["corpus"]["heldout"]["shards"]:
        replayed = json.loads((results / shard / "replay.json").read_text())
        bounds = json.loads((results / shard / "bound.json").read_text())
        t = bounds["totals"]
        assert t["b_flat"] <= t["b_star"] <= t["b_greedy"]
        assert t["integral"] and t["certified"] and t["max_fractionality"] <= 1e-6
        # Unit costs: farthest-future is optimal on every stream (docs/optimum.md).
        assert t["greedy_optimal"] and t["b_star"] == t["b_greedy"]
        oracle = replayed["rules"]["farthest-future"]["totals"]["after_fill"]
        assert t["b_greedy"] == oracle
        assert sum(s["b_flat"] for s in bounds["streams"]) == t["b_flat"]
        assert sum(s["b_star"] for s in bounds["streams"]) == t["b_star"]
        mixed = bounds["mixed_precision"]
        assert (mixed["share"], mixed["cost"]) == tuple(
            config["replay"]["mixed_precision"][k] for k in ("share", "cost")
        )
        assert mixed["seed"] == config["seed"] and mixed["totals"]["integral"]
        assert mixed["totals"]["lp"] <= mixed["totals"]["farthest_future"]
        curve = json.loads((results / shard / "foresight.json").read_text())
        for subset in ("heldout", "all"):
            ks = [p["k"] for p in curve["subsets"][subset]["foresight"]]
            assert ks == [*config["replay"]["foresight"], None]
        everything = curve["subsets"]["all"]["copies"]
        assert everything["lru"] == replayed["rules"]["lru"]["totals"]["after_fill"]
        assert curve["subsets"]["heldout"]["streams"] == len(config["harness"]["restricted_layers"])
    sweep_report = json.loads((results / "optimum-sweep.json").read_text())
    assert sweep_report["instances"] >= config["replay"]["optimum"]["instances"]
    assert sweep_report["lp_dp_disagreements"] == 0
    bench = read_dict(results / "benchmark.json", ReplayBenchmark)
    assert bench["lp"]["integral"] and bench["lp"]["lp_seconds"] > 0
    assert bench["lp"]["optimum"] == bench["lp"]["farthest_future"]
    assert (
        bench["lp"]["farthest_future"] == bench["rules"]["farthest-future"]["replay"]["insertions"]
    )
    for rule in ("lru", "farthest-future"):
        assert bench["rules"][rule]["speed_ratio"] > 0
        assert bench["rules"][rule]["replay"]["vectorised"]
    # Every zoo rule is timed too, in its per-stream loop; libCacheSim where it can run.
    for rule in ZOO:
        timed = bench["rules"][rule]
        assert timed["replay"]["requests_per_second"] > 0 and not timed["replay"]["vectorised"]
        capacity = config["replay"]["benchmark"]["capacity"]
        assert (timed["speed_ratio"] is not None) == reference.runs(rule, capacity)


def test_every_zoo_rule_replays_a_trace_and_a_demand_file(tmp_path, smoke_run):
    """`moecache replay --rule NAME` for each zoo name, on a harness trace and on a
    JSON-lines demand file; the trace's counts equal stepping the rule directly."""
    from conftest import SMOKE, load_yaml

    from moecache.records.trace import read_demand

    rules = [arg for name in ZOO for arg in ("--rule", name)]
    demand_file = write_lines(tmp_path / "d.jsonl", STREAMS)
    on_file = moecache(
        "replay",
        "--demand",
        str(demand_file),
        "--experts",
        "6",
        "--capacity",
        "3",
        *rules,
        "--json",
        check=True,
    )
    assert set(json.loads(on_file.stdout)["rules"]) == set(ZOO)
    config = load_yaml(SMOKE)
    trace = smoke_run / "results/traces/a/lru-x1.parquet"
    capacity = config["harness"]["capacity"]
    on_trace = moecache(
        "replay",
        "--trace",
        str(trace),
        "--capacity",
        str(capacity),
        *rules,
        "--json",
        check=True,
    )
    report = json.loads(on_trace.stdout)["rules"]
    demand = read_demand(trace)
    for name in ZOO:
        direct = engine.run(demand, engine.make_rule(name, demand, capacity))
        assert report[name]["totals"]["insertions"] == int(direct.insertions.sum()), name


def test_bound_and_foresight_write_their_records(tmp_path):
    """`moecache bound --out` and `moecache foresight --out` write schema-1 records that
    read back whole (a bound without --mixed-share keeps mixed_precision: null)."""
    from moecache.records import replay
    from moecache.records.io import read_record

    rows = [
        {"stream": "layer0/seq0", "tokens": [[0, 1], [2, 3], [0, 2], [1, 3], [4, 5], [0, 1]]},
        {"stream": "layer0/seq1", "tokens": [[5, 1], [2, 3], [0, 2], [4, 1], [5, 3]]},
    ]
    demand = tmp_path / "demand.jsonl"
    demand.write_text("".join(json.dumps(r) + "\n" for r in rows))
    given = ["--demand", str(demand), "--experts", "6", "--capacity", "3"]
    for name, kind, more in (
        ("bound", replay.BoundResult, []),
        ("foresight", replay.ForesightResult, ["--foresight", "1", "2", "--heldout-last", "1"]),
    ):
        out = tmp_path / f"{name}.json"
        moecache(name, *given, *more, "--out", str(out), check=True)
        data = json.loads(out.read_text())
        assert list(data)[0] == "schema" and data["schema"] == replay.SCHEMA
        assert read_record(out, kind).as_dict() == data
    assert json.loads((tmp_path / "bound.json").read_text())["mixed_precision"] is None
