# A study from a routing trace alone (config key `trace`, config/trace.yaml): the replay
# stage (replay.smk, unchanged) on the one trace, as the single shard `trace`, at the
# config's `capacity` and replay.capacities; then the tables and figures replay feeds
# (eviction, bounds, foresight, batched replay) and the scorecard, whose model, harness,
# learned, router-tuning, controller and accuracy claims read `not run`. Nothing here
# loads a model.
import json
import sys

from moecache import config as configs
from moecache.schedule import threads as job_threads

try:
    configs.validate(config)
except configs.ConfigError as error:
    sys.exit(f"config error: {error}")

CONDA_ENV = (
    "../../envs/moecache.yaml"  # relative to rules/replay.smk, whose rules use it
)
ENV = "../envs/moecache.yaml"  # the same, relative to this file, for the rules below
TRACE = config["trace"]
SHARDS = TRACE_SHARDS = ["trace"]
TRACE_CAPACITY = config["capacity"]


def settings(*sections):
    """The config sections a job reads, as JSON (it reruns when they change)."""
    keys = ("seed", "hub_offline", *sections)
    return json.dumps(
        {key: config[key] for key in keys if key in config}, sort_keys=True
    )


def timed_threads():
    """The replay benchmark claims every local core, so that it runs alone."""
    return job_threads.claim_every_core(workflow, 1)


def timed(command, threads=1):
    return job_threads.pinned(command, threads)


include: "rules/replay.smk"


localrules:
    trace_table_eviction,
    trace_table_bounds,
    trace_fig2,
    trace_table_batching,
    trace_claims,


rule trace_table_eviction:
    input:
        replay=replayed_all("replay"),
    output:
        "figures/table_eviction.csv",
        "figures/table_eviction.md",
        "figures/table_eviction.sources.json",
    log:
        "logs/figures/table_eviction.log",
    conda:
        ENV
    shell:
        "moecache table table_eviction --replay {input.replay} --learned"
        " --out-dir figures > {log} 2>&1"


rule trace_table_bounds:
    input:
        bound=replayed_all("bound"),
        sweep="results/replay/optimum-sweep.json",
    output:
        "figures/table_bounds.csv",
        "figures/table_bounds_sweep.csv",
        "figures/table_bounds_mixed_precision.csv",
        "figures/table_bounds.md",
        "figures/table_bounds.sources.json",
    log:
        "logs/figures/table_bounds.log",
    conda:
        ENV
    shell:
        "moecache table table_bounds --bound {input.bound} --sweep {input.sweep}"
        " --out-dir figures > {log} 2>&1"


rule trace_fig2:
    input:
        foresight=replayed_all("foresight"),
    output:
        "figures/fig2.pdf",
        "figures/fig2.png",
        "figures/fig2.sources.json",
    log:
        "logs/figures/fig2.log",
    conda:
        ENV
    shell:
        "moecache figure fig2 --foresight {input.foresight} --learned"
        " --out-dir figures > {log} 2>&1"


rule trace_table_batching:
    input:
        replay=replayed_batched(),
    output:
        "figures/table_batching_replay.csv",
        "figures/table_batching_harness.csv",
        "figures/table_batching.md",
        "figures/table_batching.sources.json",
    log:
        "logs/figures/table_batching.log",
    conda:
        ENV
    shell:
        "moecache table table_batching --replay {input.replay} --batched"
        " --out-dir figures > {log} 2>&1"


TRACE_FIGURES = [
    "figures/table_eviction.md",
    "figures/table_bounds.md",
    "figures/fig2.pdf",
    *(["figures/table_batching.md"] if config["replay"].get("batch_sizes") else []),
]


rule trace_claims:
    """The scorecard: its replay claims from this trace, the others `not run`."""
    input:
        results=replay_outputs(),
    output:
        "figures/claims.csv",
        "figures/claims.md",
        "figures/claims.sources.json",
    log:
        "logs/figures/claims.log",
    conda:
        ENV
    shell:
        "moecache claims --workdir . --shards trace --out-dir figures > {log} 2>&1"


def final_outputs():
    """The target `all` of a trace study: replay's outputs, the tables, figures, scorecard."""
    return [*replay_outputs(), *TRACE_FIGURES, "figures/claims.md"]
