# The offloading harness: exactness gates, decode runs, the layer probe, copy bandwidth and
# the check of the slower links.


include: "../helpers/harness.smk"


wildcard_constraints:
    shard="[a-z][a-z0-9_]*",
    label=LABEL_PATTERN,


rule gates:
    input:
        model=built("results/model"),
        sequences="results/heldout/{shard}.parquet",
    output:
        "results/gates/{shard}.json",
    log:
        "logs/gates/{shard}.log",
    benchmark:
        "benchmarks/gates/{shard}.tsv"
    conda:
        CONDA_ENV
    threads: config["harness"]["threads"]
    resources:
        gpu=1,
    params:
        settings=settings("model", "harness"),
        model=built_or_pretrained("model"),
    shell:
        "moecache gates --settings {params.settings:q} --model {params.model:q}"
        " --sequences {input.sequences} --out {output} > {log} 2>&1"


# harness.fan_out: `shard` decodes every run of a shard in one job (interleaving keeps
# their timings comparable) and local jobs split its folder; `run` decodes each run x
# multiplier x shard in a GPU job of its own, writing the same files.
if FAN_OUT == "shard":

    rule decode:
        """Every run of one shard, at its copy multipliers, interleaved in one process."""
        input:
            model=built("results/model"),
            sequences="results/heldout/{shard}.parquet",
            gates="results/gates/{shard}.json",
            heads=lambda wildcards: controller_heads_of_runs(wildcards.shard),
        output:
            directory("results/decode/{shard}"),
        log:
            "logs/decode/{shard}.log",
        benchmark:
            "benchmarks/decode/{shard}.tsv"
        conda:
            CONDA_ENV
        threads: config["harness"]["threads"]
        resources:
            gpu=1,
        params:
            settings=settings("model", "harness"),
            model=built_or_pretrained("model"),
        shell:
            "moecache decode --settings {params.settings:q} --model {params.model:q}"
            " --sequences {input.sequences} --shard {wildcards.shard}"
            f" --first-shard {FIRST_SHARD} --gates {{input.gates}} --out-dir {{output}}"
            " > {log} 2>&1"

    rule run_results:
        """One run's results file and trace, from its shard's decode job."""
        input:
            "results/decode/{shard}",
        output:
            results="results/runs/{shard}/{label}.json",
            trace="results/traces/{shard}/{label}.parquet",
        log:
            "logs/runs/{shard}/{label}.log",
        benchmark:
            "benchmarks/runs/{shard}/{label}.tsv"
        localrule: True
        conda:
            CONDA_ENV
        shell:
            "(cp {input}/{wildcards.label}.json {output.results}"
            " && cp {input}/{wildcards.label}.parquet {output.trace})"
            " > {log} 2>&1"

else:

    rule decode:
        """One run at one copy multiplier on one shard, beside its reference on the same
        device: the all-resident run for a 1x run, its 1x twin for a scaled run."""
        input:
            model=built("results/model"),
            sequences="results/heldout/{shard}.parquet",
            gates="results/gates/{shard}.json",
            heads=lambda wildcards: controller_heads_of_run(wildcards.label),
        output:
            results="results/runs/{shard}/{label}.json",
            trace="results/traces/{shard}/{label}.parquet",
        log:
            "logs/decode/{shard}/{label}.log",
        benchmark:
            "benchmarks/decode/{shard}/{label}.tsv"
        conda:
            CONDA_ENV
        threads: config["harness"]["threads"]
        resources:
            gpu=1,
        params:
            settings=settings("model", "harness"),
            model=built_or_pretrained("model"),
            run=lambda wildcards: RunName.parse(wildcards.label).run,
            multiplier=lambda wildcards: RunName.parse(wildcards.label).multiplier,
            out_dir=lambda wildcards, output: os.path.dirname(output.results),
            trace_dir=lambda wildcards, output: os.path.dirname(output.trace),
        shell:
            "moecache decode --settings {params.settings:q} --model {params.model:q}"
            " --sequences {input.sequences} --shard {wildcards.shard}"
            f" --first-shard {FIRST_SHARD} --gates {{input.gates}}"
            " --run {params.run} --multiplier {params.multiplier}"
            " --out-dir {params.out_dir} --trace-dir {params.trace_dir} > {log} 2>&1"


rule probe_layers:
    input:
        model=built("results/model"),
        sequences="results/heldout/{shard}.parquet",
        gates="results/gates/{shard}.json",
    output:
        "results/probe/{shard}.json",
    log:
        "logs/probe/{shard}.log",
    benchmark:
        "benchmarks/probe/{shard}.tsv"
    conda:
        CONDA_ENV
    threads: config["harness"]["threads"]
    resources:
        gpu=1,
    params:
        settings=settings("model", "harness"),
        model=built_or_pretrained("model"),
    shell:
        "moecache probe-layers --settings {params.settings:q} --model {params.model:q}"
        " --sequences {input.sequences} --gates {input.gates} --out {output} > {log} 2>&1"


rule bandwidth:
    input:
        model=built("results/model"),
    output:
        "results/bandwidth/{device}.json",
    log:
        "logs/bandwidth/{device}.log",
    benchmark:
        "benchmarks/bandwidth/{device}.tsv"
    conda:
        CONDA_ENV
    resources:
        gpu=1,
    params:
        settings=settings("model", "harness"),
        model=built_or_pretrained("model"),
    shell:
        "moecache bandwidth --settings {params.settings:q} --model {params.model:q}"
        " --out {output} > {log} 2>&1"


rule link_check:
    """LRU at 1x and at the largest multiplier under each slower link, interleaved."""
    input:
        model=built("results/model"),
        sequences=f"results/heldout/{FIRST_SHARD}.parquet",
    output:
        "results/link/{device}.json",
    log:
        "logs/link/{device}.log",
    benchmark:
        "benchmarks/link/{device}.tsv"
    conda:
        CONDA_ENV
    threads: config["harness"]["threads"]
    resources:
        gpu=1,
    params:
        settings=settings("model", "harness"),
        model=built_or_pretrained("model"),
    shell:
        "moecache link-check --settings {params.settings:q} --model {params.model:q}"
        " --sequences {input.sequences} --out {output} > {log} 2>&1"
