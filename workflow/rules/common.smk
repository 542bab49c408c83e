# Config validation and the helpers the rules share.
import json
import sys
from pathlib import Path

import jsonschema

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from moecache import config as configs
from moecache.learned import groups as learned_groups

try:
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
CONDA_ENV = "../../envs/moecache.yaml"


def settings(*sections):
    """The config sections a stage reads, as JSON: the rule reruns when they change. A
    section the config leaves out (a pretrained model has no `tokenizer` or `training`)
    is left out here too: its rules are never needed."""
    keys = ("seed", "hub_offline", *sections)
    return json.dumps(
        {key: config[key] for key in keys if key in config}, sort_keys=True
    )


def corpus_outputs():
    # A pretrained model's corpus has a training part only for the learned eviction trace.
    trained = EMBEDDED or "trace_sequences" in config["corpus"]
    parts = [f"shard-{shard}" for shard in SHARDS] + (["train"] if trained else [])
    return [f"results/corpus/{part}.parquet" for part in parts]


def built_or_pretrained(name):
    """A param naming the model or tokenizer: the input `name` this workflow built, or the
    pretrained source (a hub id or local folder) the config names."""
    return lambda wildcards, input: (
        str(input[name]) if EMBEDDED else config["model"]["source"]
    )


def built(path):
    """`path` as an input when this workflow builds it, nothing for a pretrained source."""
    return [path] if EMBEDDED else []


RUNS = config["harness"]["runs"]
DEVICE_TAG = config["harness"]["device"].replace(":", "")
TRACE_RUN = config["harness"]["trace_run"]
TRACE = f"results/traces/{{shard}}/{TRACE_RUN}-x1.parquet"
TRACE_CAPACITY = RUNS[TRACE_RUN].get("capacity", config["harness"]["capacity"])


def decode_outputs():
    """One results file per run x shard at 1x, and per run x multiplier on the first shard
    (slower copies rank the policies on the main shard, as in the paper)."""
    outputs = []
    for name, run in RUNS.items():
        for shard in run.get("shards", SHARDS):
            for m in run.get("multipliers", [1]):
                if m == 1 or shard == SHARDS[0]:
                    outputs.append(f"results/runs/{shard}/{name}-x{m}.json")
    return outputs


TRACE_SHARDS = RUNS[TRACE_RUN].get("shards", SHARDS)
# The trace run's own C always; replay.capacities adds others (the paper's C = N/2).
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


FIRST_SHARD = SHARDS[0]
SECOND_SHARD = SHARDS[1] if len(SHARDS) > 1 else None


def runs_at_1x(shard):
    """Every run's 1x results on `shard`."""
    return [
        f"results/runs/{shard}/{name}-x1.json"
        for name, run in RUNS.items()
        if shard in run.get("shards", SHARDS)
    ]


def scaled_runs():
    """The first shard's runs at copy multipliers above 1."""
    return [path for path in decode_outputs() if not path.endswith("-x1.json")]


def link_check_outputs():
    """The link check, when some run is scaled (it compares the links at that multiplier)."""
    return [f"results/link/{DEVICE_TAG}.json"] if scaled_runs() else []


def bandwidth_files():
    """This machine's copy bandwidth first, then any other device's measured before."""
    own = f"results/bandwidth/{DEVICE_TAG}.json"
    return [
        own,
        *sorted(set(map(str, Path("results/bandwidth").glob("*.json"))) - {own}),
    ]


def gpu_check_files():
    """Copy bandwidth from GPU checks run elsewhere: more device rows for Table 1. Those
    committed to the repository (measured/gpu-check) and this checkout's own."""
    found = [
        *Path("measured/gpu-check").glob("*.json"),
        *Path("results/gpu-check").glob("*.json"),
    ]
    return sorted(map(str, found))


PAPER_OUTPUTS = [
    "figures/table1.md",
    *expand("figures/{name}.md", name=["table2", "table3", "table_controller"]),
    "figures/table_eviction.md",
    "figures/table_bounds.md",
    "figures/table_replication.md",
    "figures/fig1.pdf",
    "figures/fig2.pdf",
    "figures/claims.md",
    "figures/numbers.md",
]


def replay_outputs():
    """Replay, bounds and foresight on every shard the trace run decodes, at every replayed
    capacity; the sweep and the benchmark once."""
    return [
        *(
            path
            for name in ("replay", "bound", "foresight")
            for path in replayed_all(name)
        ),
        "results/replay/optimum-sweep.json",
        "results/replay/benchmark.json",
    ]


def learned_evaluation():
    """The learned scorers' evaluation, when the config has a learned section."""
    return ["results/learned/evaluation.json"] if "learned" in config else []


def final_outputs():
    return [
        *built("results/model"),
        *expand("results/heldout/{shard}.parquet", shard=SHARDS),
        "results/profile/model.json",
        f"results/bandwidth/{DEVICE_TAG}.json",
        *link_check_outputs(),
        f"results/probe/{SHARDS[0]}.json",
        *decode_outputs(),
        *replay_outputs(),
        *learned_evaluation(),
        *router_measured(),  # router_tuning.smk
        *controller_sweeps(),  # controller.smk
        *controller_longer(),
        *accuracy_summaries(),  # accuracy.smk
        *PAPER_OUTPUTS,
    ]


# Learned eviction (learned.smk); the groups are those of moecache.learned.groups. Without a
# `learned` section these helpers give nothing, so none of its jobs is ever needed.
LEARNED = config.get("learned")


def learned_scorers():
    """One folder of scorers per group (every kind it trains)."""
    if not LEARNED:
        return []
    return expand(
        "results/learned/scorers/{group}",
        group=learned_groups.names(LEARNED, TRACE_SHARDS),
    )


def routing_of(source):
    """The training trace, or a held-out shard's trace."""
    if source == learned_groups.TRAINING_TRACE:
        return "results/learned/training-trace.parquet"
    return TRACE.format(shard=source)


def closed_loop_names(shard):
    """Closed-loop scorers that apply to `shard`: a past-use scorer only to its own."""
    names = LEARNED["closed_loop"] if LEARNED else []
    return [n for n in names if learned_groups.applies(n, shard)]


def closed_loop_dirs():
    return [
        f"results/learned/closed-loop/{shard}"
        for shard in TRACE_SHARDS
        if closed_loop_names(shard)
    ]


def fitted_on(wildcards):
    """A group's trace and labels: the training trace's, or its shard's."""
    source = learned_groups.source(wildcards.group)
    return {
        "trace": routing_of(source),
        "labels": f"results/learned/labels/{source}.parquet",
    }


# Router fine-tuning (router_tuning.smk). Without a `router_tuning` section these helpers give
# nothing, so none of its jobs is needed and Table 3 keeps its placeholder.
ROUTER = config.get("router_tuning") or {}
ROUTER_EMBEDDED = ROUTER.get("source") == "embedded"
ROUTER_VARIANTS = ["sft", "hit", "tag", "harness"]


def router_base(name):
    """The untuned model (and tokenizer) the stage starts from: this workflow's, or the
    source the section names."""
    if not ROUTER_EMBEDDED:
        return lambda wildcards, input: ROUTER["source"]
    return lambda wildcards, input: str(input[name])


def router_model(wildcards):
    if wildcards.measured == "base":
        return built("results/model") if ROUTER_EMBEDDED else []
    return [f"results/router_tuning/{wildcards.measured}"]


def router_model_path(wildcards, input):
    if wildcards.measured != "base":
        return f"{input.model}/model"
    return input.model if ROUTER_EMBEDDED else ROUTER["source"]


def router_tokenizer_path(wildcards, input):
    """A merged model's folder holds its tokenizer; the base's is the workflow's or the
    source's."""
    if wildcards.measured == "base" and ROUTER_EMBEDDED:
        return str(input.tokenizer)
    return router_model_path(wildcards, input)


def router_measured():
    if not ROUTER:
        return []
    return expand(
        "results/router_tuning/measured/{measured}.json",
        measured=["base", *ROUTER_VARIANTS],
    )


# The learned controller (controller.smk). Without a `controller` section these helpers give
# nothing, so none of its jobs is needed and its appendix table keeps its placeholder.
CONTROLLER = config.get("controller") or {}
LAST_SHARD = SHARDS[-1]


def controller_heads():
    """Every heads file: objective x seed, then the first of each priced at each e."""
    return configs.controller_heads(CONTROLLER) if CONTROLLER else []


def heads_flags(wildcards):
    """--objective, --seed and --price of one heads file, from its name."""
    objective, rest = wildcards.heads.split("-s", 1)
    seed, _, price = rest.partition("-e")
    return f"--objective {objective} --seed {seed}" + (
        f" --price {price}" if price else ""
    )


def sweep_point(point):
    """A sweep job's threshold (t50 -> 0.5), or reference."""
    if point == "reference":
        return point
    found = [t for t in CONTROLLER["thresholds"] if f"t{round(100 * t)}" == point]
    if not found:
        raise ValueError(f"{point}: not one of controller.thresholds")
    return found[0]


def controller_sweeps():
    if not CONTROLLER:
        return []
    points = [f"t{round(100 * t)}" for t in CONTROLLER["thresholds"]] + ["reference"]
    return expand(
        "results/controller/sweep/{point}-x{m}",
        point=points,
        m=CONTROLLER["multipliers"],
    )


def controller_longer():
    return ["results/controller/longer"] if CONTROLLER else []


# Multiple-choice accuracy (accuracy.smk): its controller rows need the controller's heads.
ACCURACY = config.get("accuracy") or {}


def accuracy_summaries():
    if not (ACCURACY and CONTROLLER):
        return []
    return expand("results/accuracy/{task}/summary.json", task=ACCURACY["tasks"])


def controller_heads_of_runs(shard):
    """The heads files that the runs decoding `shard` name: a controller run decodes
    beside the others, in Table 1 and Figure 1."""
    return sorted(
        {
            run["params"]["weights"]
            for run in RUNS.values()
            if run["policy"] == "controller" and shard in run.get("shards", SHARDS)
        }
    )
