# Config validation and what every stage shares: the shards, the runs, the trace run and
# how a rule names the model it reads. Each stage's own helpers are in workflow/helpers/.
import json
import sys
from pathlib import Path

import jsonschema

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from moecache import config as configs
from moecache.runs import RunName
from moecache.schedule import threads as job_threads

try:
    configs.fill_defaults(config)  # before validate(), which would share each default
    validate(config, "../schemas/config.schema.yaml")
    configs.check(config)
except WorkflowError as error:
    # validate() wraps the schema violation; describe that in one line.
    cause = error.__context__
    if not isinstance(cause, jsonschema.ValidationError):
        raise
    sys.exit(f"config error: {configs.describe(cause)}")
except configs.ConfigError as error:
    sys.exit(f"config error: {error}")

EMBEDDED = configs.embedded(config)
SHARDS = list(config["corpus"]["heldout"]["shards"])
FIRST_SHARD = SHARDS[0]
SECOND_SHARD = SHARDS[1] if len(SHARDS) > 1 else None
LAST_SHARD = SHARDS[-1]
CONDA_ENV = "../../envs/moecache.yaml"


def settings(*sections):
    """The config sections a stage reads, as JSON: the rule reruns when they change. A
    section the config leaves out (a pretrained model has no `tokenizer` or `training`)
    is left out here too: its rules are never needed."""
    keys = ("seed", "hub_offline", *sections)
    return json.dumps(
        {key: config[key] for key in keys if key in config}, sort_keys=True
    )


def built_or_pretrained(name):
    """A param naming the model or tokenizer: the input `name` this workflow built, or the
    pretrained source (a hub id or local folder) the config names."""
    return lambda wildcards, input: (
        str(input[name]) if EMBEDDED else config["model"]["source"]
    )


def built(path):
    """`path` as an input when this workflow builds it, nothing for a pretrained source."""
    return [path] if EMBEDDED else []


# The harness's runs; the trace run's 1x trace is what replay and learned eviction read.
RUNS = config["harness"]["runs"]
DEVICE_TAG = config["harness"]["device"].replace(":", "")
BANDWIDTH = f"results/bandwidth/{DEVICE_TAG}.json"  # this machine's copy time
TRACE_RUN = config["harness"]["trace_run"]
TRACE = f"results/traces/{{shard}}/{RunName(TRACE_RUN)}.parquet"
TRACE_CAPACITY = configs.capacity_of(config["harness"], RUNS[TRACE_RUN])
TRACE_SHARDS = configs.run_shards(RUNS[TRACE_RUN], config)


# Table 1's other devices (and the tiers' device side): the GPU checks report.devices
# names, never whatever lies in a
# folder, so the tables' inputs are the config's.
GPU_CHECKS = [
    f"measured/gpu-check/{name}.json"
    for name in config.get("report", {}).get("devices", [])
]
for path in GPU_CHECKS:
    if not Path(path).exists():
        sys.exit(f"config error: config key report.devices: no GPU check {path}")


def untimed_gpu():
    """An untimed model job's claim on the GPU `--resources gpu=1` grants: one on a CUDA
    device, where its model takes the device's memory; none on a CPU, where such jobs run
    side by side on every core (a timed job still runs alone: it claims every core)."""
    return 1 if config["harness"]["device"].startswith("cuda") else 0


def timed_threads():
    """A timed job claims every local core, so that it runs alone (schedule/threads.py)."""
    return job_threads.claim_every_core(workflow, config["harness"]["threads"])


def timed(command, threads=None):
    """A timed job's command with the math libraries' threads it always had (default
    harness.threads), not the cores it claims (schedule/threads.py)."""
    return job_threads.pinned(command, threads or config["harness"]["threads"])
