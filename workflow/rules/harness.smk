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
    threads: timed_threads()
    resources:
        gpu=1,
    params:
        settings=settings("model", "harness"),
        model=built_or_pretrained("model"),
    shell:
        timed(
            "moecache gates --settings {params.settings:q} --model {params.model:q}"
            " --sequences {input.sequences} --out {output} > {log} 2>&1"
        )


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
        threads: timed_threads()
        resources:
            gpu=1,
        params:
            settings=settings("model", "harness"),
            model=built_or_pretrained("model"),
        shell:
            timed(
                "moecache decode --settings {params.settings:q} --model {params.model:q}"
                " --sequences {input.sequences} --shard {wildcards.shard}"
                f" --first-shard {FIRST_SHARD} --gates {{input.gates}} --out-dir {{output}}"
                " > {log} 2>&1"
            )

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
        threads: timed_threads()
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
            timed(
                "moecache decode --settings {params.settings:q} --model {params.model:q}"
                " --sequences {input.sequences} --shard {wildcards.shard}"
                f" --first-shard {FIRST_SHARD} --gates {{input.gates}}"
                " --run {params.run} --multiplier {params.multiplier}"
                " --out-dir {params.out_dir} --trace-dir {params.trace_dir} > {log} 2>&1"
            )


# Batched decoding on the first shard: under fan_out `shard` one job per batch size B
# decodes every run of harness.batched at each batching mode and prefill, interleaved;
# under `run` one job per run x B x batching x prefill, beside the all-resident run.
if FAN_OUT == "shard":

    rule decode_batched:
        """Every batched run at B = {batch}, each shape's runs one after the other."""
        input:
            model=built("results/model"),
            sequences=f"results/heldout/{FIRST_SHARD}.parquet",
            gates=f"results/gates/{FIRST_SHARD}.json",
            trace=TRACE.format(shard=FIRST_SHARD),
        output:
            batched_of_size(BATCH_SIZES[0]) if BATCH_SIZES else [],
        log:
            "logs/batched/b{batch}.log",
        benchmark:
            "benchmarks/batched/b{batch}.tsv"
        wildcard_constraints:
            batch="[0-9]+",
        conda:
            CONDA_ENV
        threads: timed_threads()
        resources:
            gpu=1,
        params:
            settings=settings("model", "harness"),
            model=built_or_pretrained("model"),
        shell:
            timed(
                "moecache decode-batched --settings {params.settings:q} --model {params.model:q}"
                f" --sequences {{input.sequences}} --shard {FIRST_SHARD} --gates {{input.gates}}"
                f" --trace {{input.trace}} --batch {{wildcards.batch}}"
                f" --out-dir results/batched/{FIRST_SHARD} > {{log}} 2>&1"
            )

else:

    rule decode_batched:
        """One batched run at one shape, beside the all-resident run at that shape."""
        input:
            model=built("results/model"),
            sequences="results/heldout/{shard}.parquet",
            gates="results/gates/{shard}.json",
            trace=TRACE,
        output:
            "results/batched/{shard}/b{batch}-{batching}-p{prefill}/{run}.json",
        log:
            "logs/batched/{shard}/b{batch}-{batching}-p{prefill}/{run}.log",
        benchmark:
            "benchmarks/batched/{shard}/b{batch}-{batching}-p{prefill}/{run}.tsv"
        wildcard_constraints:
            batch="[0-9]+",
            batching="static|continuous",
            prefill="[0-9]+",
        conda:
            CONDA_ENV
        threads: timed_threads()
        resources:
            gpu=1,
        params:
            settings=settings("model", "harness"),
            model=built_or_pretrained("model"),
        shell:
            timed(
                "moecache decode-batched --settings {params.settings:q} --model {params.model:q}"
                " --sequences {input.sequences} --shard {wildcards.shard} --gates {input.gates}"
                " --trace {input.trace} --batch {wildcards.batch} --run {wildcards.run}"
                " --shape b{wildcards.batch}-{wildcards.batching}-p{wildcards.prefill}"
                " --out-dir results/batched/{wildcards.shard} > {log} 2>&1"
            )


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
    threads: timed_threads()
    resources:
        gpu=1,
    params:
        settings=settings("model", "harness"),
        model=built_or_pretrained("model"),
    shell:
        timed(
            "moecache probe-layers --settings {params.settings:q} --model {params.model:q}"
            " --sequences {input.sequences} --gates {input.gates} --out {output} > {log} 2>&1"
        )


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
    threads: timed_threads()
    resources:
        gpu=1,
    params:
        settings=settings("model", "harness"),
        model=built_or_pretrained("model"),
    shell:
        timed(
            "moecache bandwidth --settings {params.settings:q} --model {params.model:q}"
            " --out {output} > {log} 2>&1"
        )


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
    threads: timed_threads()
    resources:
        gpu=1,
    params:
        settings=settings("model", "harness"),
        model=built_or_pretrained("model"),
    shell:
        timed(
            "moecache link-check --settings {params.settings:q} --model {params.model:q}"
            " --sequences {input.sequences} --out {output} > {log} 2>&1"
        )


# The tiers measured for real (issue 40 point 3; docs/tiers.md, "Measured in the harness"):
# the embedded default's restricted layers decoded over device slots, a host cache and the
# disk, on the first shard's first harness.tiers.sequences sequences, and equation (1) with
# a term per tier checked against them, where the config has harness.tiers. The first of
# GPU_CHECKS (report.devices) prices the device side.


rule tiers_harness:
    """Prices of a disk read, a copy and a host compute, then the all-resident reference
    and one tiered arm per admission, decoded interleaved (moecache tiers-harness)."""
    input:
        model=built("results/model"),
        sequences=f"results/heldout/{FIRST_SHARD}.parquet",
        gpu_check=GPU_CHECKS[:1],
    output:
        f"results/tiers/harness/{DEVICE_TAG}.json",
    log:
        f"logs/tiers/harness-{DEVICE_TAG}.log",
    benchmark:
        f"benchmarks/tiers/harness-{DEVICE_TAG}.tsv"
    conda:
        CONDA_ENV
    threads: timed_threads()
    resources:
        gpu=1,
    params:
        settings=settings("model", "harness"),
        model=built_or_pretrained("model"),
        gpu_check=lambda wildcards, input: (
            f"--gpu-check {input.gpu_check[0]}" if input.gpu_check else ""
        ),
    shell:
        timed(
            "moecache tiers-harness --settings {params.settings:q} --model {params.model:q}"
            " --sequences {input.sequences} --out {output} {params.gpu_check} > {log} 2>&1"
        )
