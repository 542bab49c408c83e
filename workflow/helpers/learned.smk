# Learned eviction's scorer groups, traces and closed-loop folders, for learned.smk and
# the tables.
from moecache.records import scorer_groups as learned_groups

# The groups are those of moecache.records.scorer_groups. Without a `learned` section these
# helpers give nothing, so none of its jobs is ever needed.
LEARNED = config.get("learned")


def learned_evaluation():
    """The learned scorers' evaluation, when the config has a learned section."""
    return ["results/learned/evaluation.json"] if LEARNED else []


CAUSAL = (LEARNED or {}).get("causal")
CAUSAL_CHECK = "results/learned/causal-check.json"


def learned_causal():
    """The causal rules' study, when the learned section has a causal part, and their
    closed-loop check and cost, when it decodes them closed loop."""
    if not CAUSAL:
        return []
    return ["results/learned/causal.json"] + (
        [CAUSAL_CHECK] if causal_loop_shards() else []
    )


def causal_loop_shards():
    """Shards whose closed-loop job decodes the causal rules (learned.causal.closed_loop)."""
    loop = (CAUSAL or {}).get("closed_loop")
    return [s for s in TRACE_SHARDS if loop and s in loop["shards"]]


def causal_study_for(wildcards):
    """The causal study and its models, for a closed-loop job that decodes its rules."""
    if wildcards.shard not in causal_loop_shards():
        return {}
    return {
        "causal": "results/learned/causal.json",
        "causal_models": "results/learned/causal",
    }


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


def closed_loop_dirs(shards=None):
    """The closed-loop folders of `shards` (default: every shard) that decode something."""
    return [
        f"results/learned/closed-loop/{shard}"
        for shard in (TRACE_SHARDS if shards is None else shards)
        if closed_loop_names(shard) or shard in causal_loop_shards()
    ]


def fitted_on(wildcards):
    """A group's trace and labels: the training trace's, or its shard's."""
    source = learned_groups.source(wildcards.group)
    return {
        "trace": routing_of(source),
        "labels": f"results/learned/labels/{source}.parquet",
    }
