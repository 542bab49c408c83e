"""moecache.replay.tiers, tier_bound, tier_search and `moecache replay --tiers`: with no disk
and forced admission the tiers are today's replay (on recorded demand of the embedded
run); the integer program equals an exhaustive search on tiny streams and no rule costs
less; at one tier without bypass it is B*; bypass and the host tier count as documented;
bad input is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import moecache
from hypothesis import given, settings
from hypothesis import strategies as st

from moecache.errors import MoecacheError
from moecache.policies.admission import ADMISSIONS
from moecache.records.demand import from_arrays, read_jsonl
from moecache.records.io import read_record
from moecache.records.tiers import TiersResult
from moecache.replay import engine, lp, tier_bound, tier_report, tier_search, tiers

# Two sequences x four layers of shard a of the embedded default's trace run (LRU, 1x).
EMBEDDED = Path(__file__).parent / "data" / "embedded-a-demand.jsonl"
RANKED = ("lru", "farthest-future", "decayed-frequency", "mean-interval")


@pytest.fixture(scope="module")
def embedded():
    return read_jsonl(EMBEDDED, 64)


@pytest.mark.parametrize("capacity", [8, 16, 32])
@pytest.mark.parametrize("rule", RANKED)
def test_no_disk_and_forced_admission_is_todays_replay(embedded, rule, capacity):
    counts = tiers.run(embedded, rule, capacity)
    today = engine.replayed(embedded, rule, capacity)
    assert (counts.copies == today.insertions).all()
    assert (counts.steady == today.steady).all()
    assert not counts.reads.any() and not counts.computes.any()


def test_the_host_changes_no_device_copy_under_forced_admission(embedded):
    alone = tiers.run(embedded, "farthest-future", 16)
    over = tiers.run(embedded, "farthest-future", 16, host=32, host_rule="lru")
    assert (over.copies == alone.copies).all()
    assert (over.reads > 0).all()


def test_a_host_of_every_expert_reads_each_once(embedded):
    counts = tiers.run(embedded, "lru", 16, host=64, admission="bypass")
    assert (counts.reads == embedded.distinct).all()


def test_a_larger_host_reads_no_more_under_farthest_future(embedded):
    reads = [
        tiers.run(embedded, "lru", 16, host=h, host_rule="farthest-future").reads.sum()
        for h in (16, 24, 32, 48, 64)
    ]
    assert reads == sorted(reads, reverse=True) and reads[0] > reads[-1]


def test_bypass_splits_every_miss_into_a_copy_or_a_compute(embedded):
    always = tiers.run(embedded, "farthest-future", 16)
    bypass = tiers.run(embedded, "farthest-future", 16, admission="bypass")
    assert (bypass.copies < always.copies).all() and (bypass.computes > 0).all()
    # Every token requests k experts: each a hit, a copy or a compute.
    requests = embedded.lengths * embedded.top_k
    assert (bypass.copies + bypass.computes <= requests).all()


def test_the_oracle_predicts_within_its_foresight(embedded):
    def counts(rule):
        c = tiers.run(embedded, rule, 16, admission="bypass")
        return c.copies.tolist(), c.computes.tolist()

    whole = counts("farthest-future")
    assert counts("farthest-future:foresight=1000") == whole  # streams are 256 tokens
    assert counts("farthest-future:foresight=2") != whole


@pytest.mark.parametrize(
    "tokens, rule, copies, computes",
    [
        # The oracle keeps expert 0 (used again at 2 and 4) against 1 and 2 (never again).
        ([0, 1, 0, 2, 0], "farthest-future", 1, 2),
        # Recency: a never-used expert displaces no one; used once before, it displaces 0.
        ([0, 1, 0, 2, 0], "lru", 1, 2),
        ([0, 1, 1, 1], "lru", 2, 1),
        # The oracle copies 1 in at once: it comes back before 0 (never).
        ([0, 1, 1, 1], "farthest-future", 2, 0),
    ],
)
def test_bypass_by_hand(tokens, rule, copies, computes):
    demand = from_arrays(np.array(tokens)[None, :, None], 3)
    counts = tiers.run(demand, rule, 1, admission="bypass")
    assert (counts.copies[0], counts.computes[0]) == (copies, computes)


# -- the optimum against an exhaustive search ----------------------------------------------


@st.composite
def instances(draw):
    n = draw(st.integers(2, 5))
    k = draw(st.integers(1, min(2, n)))
    capacity = draw(st.integers(k, n))
    host = draw(st.one_of(st.none(), st.integers(capacity, n)))
    tokens = draw(
        st.lists(st.permutations(range(n)).map(lambda p: sorted(p[:k])), min_size=1, max_size=7)
    )
    prices = tier_bound.Prices(*(draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 5.0])) for _ in "rcw"))
    return n, capacity, host, np.array(tokens), prices


@settings(max_examples=150, deadline=None)
@given(instances(), st.booleans())
def test_the_program_equals_the_exhaustive_minimum(instance, bypass):
    n, capacity, host, tokens, prices = instance
    best = tier_bound.solve_stream(tokens, n, capacity, host, bypass, prices)
    assert best.certified
    assert best.cost == pytest.approx(
        tier_search.least_cost(tokens.tolist(), n, capacity, host, bypass, prices)
    )
    priced = best.copies * prices.copy + best.reads * prices.read + best.computes * prices.compute
    assert priced == pytest.approx(best.cost)
    assert best.relaxation <= best.cost + 1e-9


@settings(max_examples=60, deadline=None)
@given(instances())
def test_no_rule_costs_less_than_the_optimum(instance):
    n, capacity, host, tokens, prices = instance
    demand = from_arrays(tokens[None], n)
    bound = {
        b: tier_bound.solve_stream(tokens, n, capacity, host, b, prices).cost for b in (False, True)
    }
    for rule in ("lru", "farthest-future", "decayed-frequency"):
        for admission in ADMISSIONS:
            c = tiers.run(demand, rule, capacity, host, "farthest-future", admission)
            cost = c.copies[0] * prices.copy + c.reads[0] * prices.read
            cost += c.computes[0] * prices.compute
            assert cost >= bound[True] - 1e-9
            if admission == "always":
                assert cost >= bound[False] - 1e-9


@settings(max_examples=80, deadline=None)
@given(instances())
def test_one_tier_without_bypass_is_b_star(instance):
    n, capacity, _, tokens, _ = instance
    best = tier_bound.solve_stream(tokens, n, capacity, None, False, tier_bound.Prices(1, 1, 1))
    assert best.copies == lp.solve_stream(tokens, n, capacity).copies
    assert best.reads == best.computes == 0


def test_farthest_future_with_bypass_is_not_always_optimal():
    """The oracle rule ranks by next use alone. With a compute twice a copy, at token 6 it
    computes 3 (never used again, as the resident 1) where a copy is cheaper: 7 against
    the program's 6 (copying every miss costs 6)."""
    prices = tier_bound.Prices(copy=1.0, read=0.0, compute=2.0)
    tokens = np.array([2, 0, 0, 1, 3, 1, 3])[:, None]
    c = tiers.run(from_arrays(tokens[None], 4), "farthest-future", 1, admission="bypass")
    assert (c.copies[0], c.computes[0]) == (3, 2)
    best = tier_bound.solve_stream(tokens, 4, 1, None, True, prices)
    assert best.cost == 6.0 and best.certified


def test_the_optimum_on_recorded_demand_is_certified(embedded):
    part = from_arrays(embedded.requests[:1, :64], 64)
    report = tier_report.report(
        part, 16, 32, ["farthest-future"], "lru", ["always", "bypass"], tier_report.prices(), True
    )
    for admission in ("always", "bypass"):
        best = report["schedules"][f"optimum/{admission}"]["totals"]
        rule = report["schedules"][f"farthest-future/{admission}"]["totals"]
        assert best["certified"] and best["bound_ms"] <= best["ms"] + 1e-9 <= rule["ms"] + 1e-9


def test_a_stopped_search_is_no_worse_than_the_rules_it_starts_from(embedded):
    part = from_arrays(embedded.requests[:2, :128], 64)
    rules = ["lru", "farthest-future"]
    section = tier_report.prices()
    report = tier_report.report(part, 16, 32, rules, "lru", ["always"], section, True, 0.2)
    best = report["schedules"]["optimum/always"]["streams"]
    for s, row in enumerate(best):
        rule = min(report["schedules"][f"{r}/always"]["streams"][s]["ms"] for r in rules)
        assert row["bound_ms"] <= row["ms"] <= rule + 1e-9


# -- the command -------------------------------------------------------------------------


def test_the_command_writes_its_record(tmp_path):
    out = tmp_path / "tiers.json"
    settings_json = json.dumps({"seed": 0, "hub_offline": True, "tiers": {"disk_to_host_ms": 2.0}})
    done = moecache(
        "replay", "--tiers", "--demand", EMBEDDED, "--experts", 64, "--capacity", 16,
        "--host", 32, "--rule", "lru", "--admission", "bypass", "--settings", settings_json,
        "--out", out,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "lru/bypass" in done.stdout
    record = read_record(out, TiersResult)
    assert record.prices == {
        "disk_to_host_ms": 2.0,
        "host_to_device_ms": 0.51,
        "host_compute_ms": 0.25,
    }
    demand = read_jsonl(EMBEDDED, 64)
    counts = tiers.run(demand, "lru", 16, 32, "lru", "bypass")
    totals = record.schedules["lru/bypass"]["totals"]
    assert (totals["copies"], totals["reads"], totals["computes"]) == (
        counts.copies.sum(),
        counts.reads.sum(),
        counts.computes.sum(),
    )
    expected = (counts.copies.sum() * 0.51 + counts.reads.sum() * 2.0) + (
        counts.computes.sum() * 0.25
    )
    assert totals["ms"] == pytest.approx(expected)
    assert set(record.schedules["lru/bypass"]["layers"]) == {f"layer{i}" for i in range(4)}


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--tiers", "--host", "8"], "--host 8: capacity 16 is larger than host 8"),
        (["--tiers", "--host", "65"], "--host 65: host 65 is larger than experts 64"),
        (["--tiers", "--host", "lots"], "--host lots: an expert count or inf"),
        (["--tiers", "--rule", "nope"], "unknown policy 'nope'"),
        (["--tiers", "--rule", "fifo"], "rule fifo: the tiers run the ranked eviction rules"),
        (["--tiers", "--host", "32", "--host-rule", "sieve"], "rule sieve: the tiers run"),
        (["--tiers", "--batch", "2"], "--tiers replays one sequence a step"),
        (["--tiers", "--optimum-seconds", "0"], "--optimum-seconds 0: must be positive"),
        (["--host", "32"], "--host: only with --tiers"),
        (["--admission", "bypass"], "--admission: only with --tiers"),
    ],
)
def test_bad_input_is_one_line(flags, message):
    done = moecache(
        "replay", "--demand", EMBEDDED, "--experts", 64, "--capacity", 16, *flags
    )  # fmt: skip
    assert done.returncode != 0 and not done.stdout
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_bad_prices_are_refused():
    bad = json.dumps({"seed": 0, "hub_offline": True, "tiers": {"host_compute_ms": -1}})
    done = moecache(
        "replay", "--tiers", "--demand", EMBEDDED, "--experts", 64, "--capacity", 16,
        "--settings", bad,
    )  # fmt: skip
    assert done.returncode != 0 and "host_compute_ms" in done.stderr


def test_the_prices_default_to_the_schema():
    assert tier_report.prices() == {
        "disk_to_host_ms": 5.1,
        "host_to_device_ms": 0.51,
        "host_compute_ms": 0.25,
    }
    with pytest.raises(MoecacheError, match="--admission maybe"):
        tiers.check_layout(from_arrays(np.zeros((1, 2, 1), dtype=int), 2), 1, None, "maybe")
