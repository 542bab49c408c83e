"""Restricting policies at B >= 1 through the union block: one allowed set for the whole
batch, planned once per step on the union of the routers' requests, each row's router
choosing among the resident experts. At B = 1 it is batch-one decoding of the same policy;
at B > 1 every row computes on resident experts only, the pool never holds more than C and
copies happen only at the policy's refreshes. The all-resident pool runs through it too,
and policies the block cannot run are refused in one line."""

from __future__ import annotations

import pytest
import test_batched_decode as shared

from moecache import policies
from moecache.config import run_spec
from moecache.errors import MoecacheError
from moecache.harness import batched, batched_runs, decode, gates
from moecache.harness.union_block import UnionBlock

# The tiny model, its sequences and their batch-one run, as the batched harness tests use.
model, sequences, batch_one, held = shared.model, shared.sequences, shared.batch_one, shared.held
EXPERTS, LAYERS, TOP_K = shared.EXPERTS, shared.LAYERS, shared.TOP_K
DWELL = run_spec("dwell", {"k": 4})  # refreshes at tokens 0..3, 7, 11, ...
CAPACITY = 6  # below two sequences' union (2 * top-k 4)


def run(model, sequences, spec, capacity, size, **how):
    make = batched.policy_factory(spec, capacity, EXPERTS, TOP_K, size)
    with decode.offloaded(model, LAYERS, capacity, "cpu", 1) as off:
        arm = off.arm(spec["policy"], make, capacity, block=UnionBlock)
        return batched_runs.decode_batched(model, sequences, "cpu", arm, off.own, size, **how)


def test_dwell_at_batch_one_is_batch_one_decoding(model, sequences, batch_one):
    make = decode.policy_factory(DWELL, CAPACITY, EXPERTS, TOP_K)
    with decode.offloaded(model, LAYERS, CAPACITY, "cpu", 1) as off:
        arm = off.arm("dwell", make, CAPACITY)
        one = decode.decode(model, sequences, "cpu", [arm], off.own, warmup_tokens=2)["dwell"]
    got = run(model, sequences, DWELL, CAPACITY, 1)
    for row, want in zip(got["batches"], one["sequences"], strict=True):
        assert (row["fills"], row["steady"]) == (want["fills"], want["steady"])
    for row, want in zip(got["sequences"], one["sequences"], strict=True):
        assert row["nll_sum"] == pytest.approx(want["nll_sum"], abs=1e-6)
    assert used(got["trace"], "batch") == used(one["trace"], "sequence")
    assert sum(row["steady"] for row in got["batches"]) > 0  # refreshes evicted
    lru_nll = batch_one[0]  # restricted routing changed some sequence's NLL
    assert any(abs(r["nll_sum"] - lru_nll[r["sequence"]]) > 1e-3 for r in got["sequences"])


@pytest.mark.parametrize("batching", ["static", "continuous"])
@pytest.mark.parametrize("size", [2, 4])
def test_restricted_rows_use_only_resident_experts(
    model, sequences, held, monkeypatch, size, batching
):
    rows = []
    kernel = UnionBlock.kernel

    def spy(self, x, slots, weights):
        occupied = set(self.pool.slot_of.values())  # the slots of the resident experts
        assert len(slots) == len(x) and all(s in occupied for row in slots for s in row)
        rows.append(len(slots))
        return kernel(self, x, slots, weights)

    monkeypatch.setattr(UnionBlock, "kernel", spy)
    got = run(model, sequences, DWELL, CAPACITY, size, batching=batching)
    assert max(rows) == size  # the whole batch in one computation: no rounds
    trace = got["trace"]
    assert all(step["rounds"] == 1 for step in trace)
    assert any(len(step["requested"]) > CAPACITY for step in trace)  # unions wider than C
    assert all(step["refreshed"] or step["copied"] == 0 for step in trace)
    due = policies.make("dwell", CAPACITY, EXPERTS, TOP_K, DWELL["params"]).due
    for steps in per_stream(trace).values():  # refreshes exactly on the policy's schedule
        assert [s["token"] for s in steps if s["refreshed"]] == [
            s["token"] for s in steps if due(s["token"])
        ]
    copies = sum(c["insertions"] for row in got["batches"] for c in row["layers"].values())
    assert copies == sum(step["copied"] for step in trace) > 0
    assert 0 < held[0] <= CAPACITY


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_the_all_resident_pool_runs_through_the_union_block(model, sequences, batch_one, batching):
    nll = batch_one[0]
    got = run(model, sequences, run_spec("all"), EXPERTS, 2, batching=batching)
    for row in got["sequences"]:  # lossless: every sequence's batch-one NLL
        assert row["nll_sum"] / row["scored"] == pytest.approx(
            nll[row["sequence"]] / row["scored"], abs=gates.BATCHED_TOLERANCE
        )
    for row in got["batches"]:  # filled once per stream, then nothing copied
        for counts in row["layers"].values():
            assert counts == {"insertions": EXPERTS, "fills": EXPERTS, "steady": 0}


def test_the_factory_builds_fresh_policies_for_the_union():
    make = batched.policy_factory(run_spec("lru"), CAPACITY, EXPERTS, TOP_K, 4)
    assert make() is not make()
    assert make().top_k == CAPACITY  # a round is at most C experts
    assert batched.policy_factory(run_spec("lru"), 8, EXPERTS, TOP_K, 4, 7)().top_k == 7
    dwell = batched.policy_factory(DWELL, CAPACITY, EXPERTS, TOP_K, 4)()
    assert dwell.top_k == EXPERTS  # plans on a whole union, however wide
    dwell.reset()
    dwell.change(0, list(range(12)), None, set())  # a union of 12 > C experts is one request


@pytest.mark.parametrize(
    "spec",
    [
        run_spec("controller", {"weights": "heads.safetensors"}),
        run_spec("router-logit"),
        run_spec("oracle-set"),
    ],
)
def test_policies_the_union_block_cannot_run_are_refused_in_one_line(spec):
    with pytest.raises(MoecacheError) as refused:
        batched.policy_factory(spec, CAPACITY, EXPERTS, TOP_K, 2)
    message = str(refused.value)
    assert message.startswith(f"--batch 2: policy {spec['policy']} reads the router's")
    assert "\n" not in message


def used(trace: list[dict], unit: str) -> list:
    """(sequence or batch, layer, token, experts used) of each step, in order."""
    return sorted((s[unit], s["layer"], s["token"], list(s["used"])) for s in trace)


def per_stream(trace: list[dict]) -> dict:
    out: dict = {}
    for step in trace:
        out.setdefault((step["layer"], step["batch"]), []).append(step)
    return out
