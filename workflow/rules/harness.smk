# The offloading harness: exactness gates, decode runs, the layer probe and copy bandwidth.


wildcard_constraints:
    shard="[a-z][a-z0-9_]*",
    run="[a-z0-9][a-z0-9-]*",
    multiplier="[0-9]+",


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


rule decode:
    input:
        model=built("results/model"),
        sequences="results/heldout/{shard}.parquet",
        gates="results/gates/{shard}.json",
        trace_in=trace_input,
    output:
        results="results/runs/{shard}/{run}-x{multiplier}.json",
        trace="results/traces/{shard}/{run}-x{multiplier}.parquet",
    log:
        "logs/decode/{shard}/{run}-x{multiplier}.log",
    benchmark:
        "benchmarks/decode/{shard}/{run}-x{multiplier}.tsv"
    conda:
        CONDA_ENV
    threads: config["harness"]["threads"]
    resources:
        gpu=1,
    params:
        settings=settings("model", "harness"),
        model=built_or_pretrained("model"),
        trace_in=lambda wildcards, input: (
            f"--trace-in {input.trace_in}" if input.trace_in else ""
        ),
    shell:
        "moecache decode --settings {params.settings:q} --model {params.model:q}"
        " --sequences {input.sequences} --run {wildcards.run}"
        " --multiplier {wildcards.multiplier} --gates {input.gates} {params.trace_in}"
        " --out {output.results} --trace-out {output.trace} > {log} 2>&1"


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
