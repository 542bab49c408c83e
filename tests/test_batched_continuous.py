"""Continuous batching in the harness: a finished sequence's slot is refilled at once, one
pool and policy stream per layer for the whole shard. For lossless rules every sequence
keeps its batch-one NLL (rows of different ages share one KV cache, the positions before a
row joined masked), the recorded unions and the copies equal the continuous replay's, the
pool never holds more than C, and the cache is trimmed to the oldest running sequence."""

from __future__ import annotations

import pytest
import test_batched_decode as shared

from moecache.errors import MoecacheError
from moecache.harness import continuous, gates
from moecache.records import batch as geometry
from moecache.records.demand import PAD
from moecache.replay import batch as replay_batch

# The tiny model, its sequences and their batch-one run, as the batched harness tests use.
model, sequences, batch_one, held = shared.model, shared.sequences, shared.batch_one, shared.held
CAPACITY = 6  # below two sequences' union (2 * top-k 4): steps at B > 1 go in rounds


@pytest.mark.parametrize("rule", ["lru", "farthest-future", "decayed-frequency"])
@pytest.mark.parametrize("size", [1, 2, 4])
def test_continuous_lossless_runs_equal_batch_one_and_the_replay(
    model, sequences, batch_one, held, rule, size
):
    nll, demand, futures = batch_one
    union_demand = replay_batch.batched(demand, size, "continuous")
    got = shared.run_batched(
        model, sequences, rule, CAPACITY, size, union_demand.top_k, futures, batching="continuous"
    )
    for row in got["sequences"]:  # every sequence's routing unchanged: its batch-one NLL
        assert row["nll_sum"] / row["scored"] == pytest.approx(
            nll[row["sequence"]] / row["scored"], abs=gates.BATCHED_TOLERANCE
        )
    assert recorded(got["trace"]) == replayed(union_demand)
    counts = replay_batch.serve(union_demand, rule, CAPACITY)
    want = {
        name: (int(counts.insertions[s]), int(counts.fills[s]), int(counts.steady[s]))
        for s, name in enumerate(union_demand.streams)
    }
    (stream,) = got["batches"]  # one stream for the whole shard
    have = {
        f"layer{layer}/continuous": (c["insertions"], c["fills"], c["steady"])
        for layer, c in stream["layers"].items()
    }
    assert have == want
    assert sum(c[2] for c in have.values()) > 0  # the pools were full: eviction mattered
    assert 0 < held[0] <= CAPACITY
    assert got["totals"]["batch"] == replay_batch.described(union_demand, CAPACITY)
    assert got["totals"]["batch"]["batching"] == "continuous"
    if size > 1:
        assert got["totals"]["batch"]["steps_in_rounds"] > 0


def test_slots_are_refilled_at_once_in_the_replays_places(model, sequences):
    got = shared.run_batched(model, sequences, "lru", 8, 2, 8, batching="continuous")
    lengths = shared.LENGTHS
    placed = geometry.places(lengths, 2, "continuous")
    assert [row["slot"] for row in got["sequences"]] == [slot for _, slot, _ in placed]
    (stream,) = got["batches"]
    steps = max(at + n for (_, _, at), n in zip(placed, lengths, strict=True))
    assert steps < sum(lengths)  # two at a time, the stream shorter than one after another
    # Every step but the untimed first has both slots full until the sequences run out.
    assert len(stream["running_each"]) == steps - 1
    assert stream["running_each"][: steps - max(lengths)] == [2] * (steps - max(lengths))


def test_the_cache_is_trimmed_to_the_oldest_running_sequence(model, sequences, monkeypatch):
    widths = []
    mask = continuous.RaggedCache.mask

    def spy(self, device):
        out = mask(self, device)
        widths.append(out.shape[1])
        assert bool(out.any(dim=1).all()) and bool(out[:, -1].all())  # each row sees itself
        return out

    monkeypatch.setattr(continuous.RaggedCache, "mask", spy)
    shared.run_batched(model, sequences, "lru", 8, 2, 8, batching="continuous")
    assert len(widths) > max(shared.LENGTHS)  # without trimming the cache would outgrow it
    assert max(widths) <= max(shared.LENGTHS)


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ({"batching": "dynamic"}, "--batching dynamic: known are static, continuous"),
        ({"batching": "continuous", "prefill": 2}, "--prefill 2: defined for static batching"),
    ],
)
def test_unknown_batching_and_continuous_prefill_are_refused(model, sequences, how, message):
    with pytest.raises(MoecacheError, match=message) as refused:
        shared.run_batched(model, sequences, "lru", 8, 2, 8, **how)
    assert "\n" not in str(refused.value)


def recorded(trace: list[dict]) -> dict:
    """The union demand a continuous run recorded: layer -> each step's union."""
    out: dict = {}
    for step in trace:
        assert step["batch"] == 0
        out.setdefault(step["layer"], []).append(list(step["requested"]))
    return out


def replayed(union_demand) -> dict:
    """The same from the continuous replay's streams ("layer<L>/continuous")."""
    out = {}
    for s, name in enumerate(union_demand.streams):
        rows = union_demand.requests[s, : union_demand.lengths[s]]
        out[int(name.split("/")[0].removeprefix("layer"))] = [
            [int(e) for e in row if e != PAD] for row in rows
        ]
    return out
