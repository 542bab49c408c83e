# The harness's results files: one per run x shard at 1x and per multiplier on the first
# shard, named by moecache.runs; the tables read them.
import os

from moecache.runs import LABEL_PATTERN, batch_shapes
from moecache.schedule import runs as schedule

FAN_OUT = configs.fan_out(config)


def reference_kept():
    """Whether the all-resident runs are decoded (harness.device_gib may be too small for
    them: the package's own answer, schedule/accountant.py; its import loads torch, so only then).
    """
    if "device_gib" not in config["harness"]:
        return True
    from moecache.schedule.accountant import reference_left_out

    return reference_left_out(config) is None


# (shard, run name) of every results file, as the decode jobs decode them (schedule/runs.py).
DECODED = schedule.decoded(config, reference_kept())


def results_file(shard, name):
    return f"results/runs/{shard}/{name}.json"


def decode_outputs():
    return [results_file(shard, name) for shard, name in DECODED]


def runs_at_1x(shard):
    """Every run's 1x results on `shard` (the all-resident ones too)."""
    return [
        results_file(s, name)
        for s, name in schedule.decoded(config, True)
        if s == shard and name.multiplier == 1
    ]


def scaled_runs():
    """The first shard's runs at copy multipliers above 1."""
    return [
        results_file(shard, name) for shard, name in DECODED if name.multiplier != 1
    ]


def link_check_outputs():
    """The link check, when some run is scaled (it compares the links at that multiplier)."""
    return [f"results/link/{DEVICE_TAG}.json"] if scaled_runs() else []


def controller_heads_of_runs(shard):
    """The heads files that the runs decoding `shard` name: a controller run decodes
    beside the others, in Table 1 and Figure 1."""
    return sorted(
        {
            run["params"]["weights"]
            for run in RUNS.values()
            if run["policy"] == "controller"
            and shard in configs.run_shards(run, config)
        }
    )


def controller_heads_of_run(label):
    """The heads file a controller run names (fan_out `run`: one job a run)."""
    run = RUNS[RunName.parse(label).run]
    return [run["params"]["weights"]] if run["policy"] == "controller" else []


# Batched decoding (harness.batched at each of harness.batch_sizes) on the first shard:
# results/batched/<shard>/b<B>-<batching>-p<P>/<run>.json (moecache.runs.BatchShape).
BATCH_SIZES = config["harness"].get("batch_sizes", [])
BATCHED = config["harness"].get("batched", {})
BATCHED_RUNS = BATCHED.get("runs", [])


def batched_file(shape, run, shard=FIRST_SHARD):
    return f"results/batched/{shard}/{shape}/{run}.json"


def batched_outputs():
    """Every batched results file: each run at each shape of each B."""
    return [
        batched_file(shape, run)
        for shape in batch_shapes(BATCH_SIZES, BATCHED)
        for run in BATCHED_RUNS
    ]


def batched_of_size(size):
    """The files one fan_out `shard` job writes: every run at every shape of B = size,
    {batch} left for the rule's wildcard."""
    return [
        batched_file(str(shape).replace(f"b{size}-", "b{batch}-", 1), run)
        for shape in batch_shapes([size], BATCHED)
        for run in BATCHED_RUNS
    ]


def tiers_harness():
    """The tiers measured in the harness, when the config has harness.tiers."""
    if "tiers" not in config["harness"]:
        return []
    return [f"results/tiers/harness/{DEVICE_TAG}.json"]
