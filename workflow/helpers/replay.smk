# Replay, bound and foresight files at each capacity, for replay.smk and the tables.
# The trace run's own C always; replay.capacities adds others (the paper's C = N/2).
from moecache.runs import batch_shapes

REPLAY_CAPACITIES = sorted({TRACE_CAPACITY, *config["replay"].get("capacities", [])})


def replayed(shard, name, capacity=TRACE_CAPACITY):
    """A replay, bound or foresight file: the trace run's C in the shard's folder (where
    the learned stage reads it), any other C under c<C>/."""
    where = "" if capacity == TRACE_CAPACITY else f"c{capacity}/"
    return f"results/replay/{shard}/{where}{name}.json"


def replay_capacity(wildcards):
    """A replay job's C: its `capacity` wildcard (c<C>/), else the trace run's."""
    return int(wildcards.get("capacity", TRACE_CAPACITY))


def replayed_all(name, shards=None):
    """`name` at every capacity of every trace shard (or of `shards`)."""
    return [
        replayed(shard, name, capacity)
        for shard in shards or TRACE_SHARDS
        for capacity in REPLAY_CAPACITIES
    ]


def replay_outputs():
    """Replay (per token and per request), bounds and foresight on every shard the trace
    run decodes, at every replayed capacity; the sweep and the benchmark once."""
    return [
        *(
            path
            for name in ("replay", "per-request", "bound", "foresight")
            for path in replayed_all(name)
        ),
        *replayed_batched(),
        "results/replay/optimum-sweep.json",
        "results/replay/benchmark.json",
    ]


def replayed_batched(shard=None):
    """The batched replay of the first trace shard (or `shard`) at every B of
    replay.batch_sizes, in harness.batched's batching modes, without prefill (the
    harness reports the prefill's copies; `moecache replay --prefill` replays them)."""
    batched = config.get("harness", {}).get("batched")  # a trace study has no harness
    if batched is None:
        batched = {"batching": configs.schema_default("harness", "batched", "batching")}
    batching = batched["batching"]
    shapes = batch_shapes(
        config["replay"].get("batch_sizes", []), {"batching": batching, "prefill": [0]}
    )
    shard = shard or TRACE_SHARDS[0]
    return [f"results/replay/{shard}/batched/{shape}.json" for shape in shapes]


# The tiered replay's grid (tiers.grid), for replay.smk's rule tiers_grid and the report.
TIERS_GRID = config.get("tiers", {}).get("grid")
TIERS_SHARDS = (TIERS_GRID or {}).get("shards", TRACE_SHARDS)


def tiers_grid():
    """The tiered replays' grid, when the config has tiers.grid."""
    return ["results/tiers/grid.json"] if TIERS_GRID else []
