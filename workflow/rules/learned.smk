# Learned eviction (config section `learned`): the routing of training sequences, the
# oracle's evictions as labels, one scorer per group and kind, the scorers decoding in the
# harness (closed loop), and their share of the gap in replay and closed loop.


include: "../helpers/learned.smk"


wildcard_constraints:
    source="training-trace|[a-z][a-z0-9_]*",
    group="router|trace-past-use|past-use-[a-z][a-z0-9_]*",


rule learned_trace:
    input:
        model=built("results/model"),
        tokenizer=built("results/tokenizer"),
        text="results/corpus/train.parquet",
    output:
        "results/learned/training-trace.parquet",
    log:
        "logs/learned/training-trace.log",
    benchmark:
        "benchmarks/learned/training-trace.tsv"
    conda:
        CONDA_ENV
    threads: config["harness"]["threads"]
    resources:
        gpu=untimed_gpu(),
    params:
        settings=settings("corpus", "model", "harness"),
        model=built_or_pretrained("model"),
        tokenizer=built_or_pretrained("tokenizer"),
    shell:
        "moecache learned-trace --settings {params.settings:q} --model {params.model:q}"
        " --tokenizer {params.tokenizer:q} --text {input.text} --out {output} > {log} 2>&1"


rule learned_labels:
    input:
        trace=lambda wildcards: routing_of(wildcards.source),
    output:
        "results/learned/labels/{source}.parquet",
    log:
        "logs/learned/labels/{source}.log",
    benchmark:
        "benchmarks/learned/labels/{source}.tsv"
    conda:
        CONDA_ENV
    params:
        capacity=config["harness"]["capacity"],
    shell:
        "moecache learned-labels --trace {input.trace} --capacity {params.capacity}"
        " --out {output} > {log} 2>&1"


rule learned_fit:
    """Every scorer of one group, on one feature table."""
    input:
        unpack(fitted_on),
    output:
        directory("results/learned/scorers/{group}"),
    log:
        "logs/learned/fit/{group}.log",
    benchmark:
        "benchmarks/learned/fit/{group}.tsv"
    conda:
        CONDA_ENV
    threads: 1
    params:
        settings=settings("model", "harness", "replay", "learned"),
    shell:
        "moecache learned-fit --settings {params.settings:q} --group {wildcards.group}"
        " --trace {input.trace} --labels {input.labels} --out-dir {output} > {log} 2>&1"


rule learned_closed_loop:
    """The closed-loop scorers decoding one shard in the harness, interleaved; then, on
    the shards of learned.causal.closed_loop, the causal study's rules on its first
    sequences."""
    input:
        unpack(causal_study_for),
        model=built("results/model"),
        sequences="results/heldout/{shard}.parquet",
        gates="results/gates/{shard}.json",
        scorers=lambda wildcards: sorted(
            {
                f"results/learned/scorers/{name.split('/')[0]}"
                for name in closed_loop_names(wildcards.shard)
            }
        ),
    output:
        directory("results/learned/closed-loop/{shard}"),
    log:
        "logs/learned/closed-loop/{shard}.log",
    benchmark:
        "benchmarks/learned/closed-loop/{shard}.tsv"
    conda:
        CONDA_ENV
    threads: timed_threads()
    resources:
        gpu=1,
    params:
        settings=settings("model", "harness", "learned"),
        model=built_or_pretrained("model"),
        causal=lambda wildcards, input: (
            f"--causal {input.causal}" if "causal" in input.keys() else ""
        ),
    shell:
        timed(
            "moecache learned-closed-loop --settings {params.settings:q} --model {params.model:q}"
            " --sequences {input.sequences} --shard {wildcards.shard} --gates {input.gates}"
            " {params.causal} --out-dir {output} > {log} 2>&1"
        )


rule learned_evaluate:
    input:
        traces=expand(TRACE, shard=TRACE_SHARDS),
        foresight=expand("results/replay/{shard}/foresight.json", shard=TRACE_SHARDS),
        scorers=learned_scorers(),
        closed=closed_loop_dirs(),
    output:
        "results/learned/evaluation.json",
    log:
        "logs/learned/evaluation.log",
    benchmark:
        "benchmarks/learned/evaluation.tsv"
    conda:
        CONDA_ENV
    params:
        settings=settings("model", "harness", "replay", "learned"),
        traces=" ".join(f"{s}={TRACE.format(shard=s)}" for s in TRACE_SHARDS),
        foresight=" ".join(
            f"{s}=results/replay/{s}/foresight.json" for s in TRACE_SHARDS
        ),
    shell:
        "moecache learned-evaluate --settings {params.settings:q} --trace {params.traces}"
        " --foresight {params.foresight} --scorers {input.scorers}"
        " --closed-loop {input.closed} --out {output} > {log} 2>&1"


rule learned_causal:
    """Causal rules tuned and the next-use model fitted on the training trace, then every
    one replayed on each shard's trace at every capacity of learned.causal."""
    input:
        training="results/learned/training-trace.parquet",
        traces=expand(TRACE, shard=TRACE_SHARDS),
    output:
        json="results/learned/causal.json",
        models=directory("results/learned/causal"),
    log:
        "logs/learned/causal.log",
    benchmark:
        "benchmarks/learned/causal.tsv"
    conda:
        CONDA_ENV
    threads: 1
    params:
        settings=settings("model", "learned"),
        traces=" ".join(f"{s}={TRACE.format(shard=s)}" for s in TRACE_SHARDS),
    shell:
        "moecache learned-causal --settings {params.settings:q} --training {input.training}"
        " --trace {params.traces} --out-dir {output.models} --out {output.json} > {log} 2>&1"


rule learned_causal_check:
    """The causal rules' closed-loop copies against their replay on the same sequences, and
    each rule's decisions timed against LRU's, set against the copies it saves at 1x."""
    input:
        causal="results/learned/causal.json",
        models="results/learned/causal",
        traces=lambda wildcards: expand(TRACE, shard=causal_loop_shards()),
        closed=lambda wildcards: closed_loop_dirs(causal_loop_shards()),
        bandwidth=BANDWIDTH,
    output:
        CAUSAL_CHECK,
    log:
        "logs/learned/causal-check.log",
    benchmark:
        "benchmarks/learned/causal-check.tsv"
    conda:
        CONDA_ENV
    threads: timed_threads()
    params:
        settings=settings("model", "harness", "learned"),
        traces=lambda wildcards: " ".join(
            f"{s}={TRACE.format(shard=s)}" for s in causal_loop_shards()
        ),
    shell:
        timed(
            "moecache learned-causal-check --settings {params.settings:q} --causal {input.causal}"
            " --trace {params.traces} --closed-loop {input.closed} --bandwidth {input.bandwidth}"
            " --out {output} > {log} 2>&1"
        )
