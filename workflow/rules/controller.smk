# The learned cache controller: heads trained over objective x seed and the priced sweep,
# each threshold evaluated in the harness at each copy multiplier, and longer sequences.


include: "../helpers/controller.smk"


wildcard_constraints:
    heads=HEADS_PATTERN,
    sweep=f"({POINT_PATTERN})-x[0-9]+",


rule controller_train:
    input:
        model=built("results/model"),
        tokenizer=built("results/tokenizer"),
        text="results/corpus/train.parquet",
        bandwidth=BANDWIDTH,
    output:
        heads="results/controller/heads/{heads}.safetensors",
        log="results/controller/heads/{heads}.json",
    log:
        "logs/controller/train/{heads}.log",
    benchmark:
        "benchmarks/controller/train/{heads}.tsv"
    conda:
        CONDA_ENV
    threads: CONTROLLER.get("threads", 1)
    resources:
        gpu=untimed_gpu(),
    params:
        settings=settings("corpus", "model", "harness", "controller"),
        model=built_or_pretrained("model"),
        tokenizer=built_or_pretrained("tokenizer"),
        flags=heads_flags,
    shell:
        "moecache controller-train --settings {params.settings:q} --model {params.model:q}"
        " --tokenizer {params.tokenizer:q} --text {input.text} --bandwidth {input.bandwidth}"
        " {params.flags} --out {output.heads} > {log} 2>&1"


rule controller_sweep:
    """Every heads file at one threshold (or the compared runs), at one copy multiplier."""
    input:
        model=built("results/model"),
        sequences=f"results/heldout/{FIRST_SHARD}.parquet",
        gates=f"results/gates/{FIRST_SHARD}.json",
        heads=lambda wildcards: (
            [] if sweep_point(wildcards) == "reference" else controller_heads()
        ),
    output:
        directory("results/controller/sweep/{sweep}"),
    log:
        "logs/controller/sweep/{sweep}.log",
    benchmark:
        "benchmarks/controller/sweep/{sweep}.tsv"
    conda:
        CONDA_ENV
    threads: timed_threads()
    resources:
        gpu=1,
    params:
        settings=settings("corpus", "model", "harness", "controller"),
        model=built_or_pretrained("model"),
        point=sweep_point,
        multiplier=lambda wildcards: sweep_of(wildcards).multiplier,
    shell:
        timed(
            "moecache controller-sweep --settings {params.settings:q} --model {params.model:q}"
            f" --sequences {{input.sequences}} --shard {FIRST_SHARD} --gates {{input.gates}}"
            " --point {params.point} --multiplier {params.multiplier} --heads {input.heads}"
            " --out-dir {output} > {log} 2>&1"
        )


rule controller_longer:
    """The paper's open question: does the gap narrow on sequences several times longer?"""
    input:
        model=built("results/model"),
        sequences=f"results/heldout/{LAST_SHARD}.parquet",
        gates=f"results/gates/{LAST_SHARD}.json",
        heads=controller_heads()[:1],
    output:
        directory("results/controller/longer"),
    log:
        "logs/controller/longer.log",
    benchmark:
        "benchmarks/controller/longer.tsv"
    conda:
        CONDA_ENV
    threads: timed_threads()
    resources:
        gpu=1,
    params:
        settings=settings("corpus", "model", "harness", "controller"),
        model=built_or_pretrained("model"),
    shell:
        timed(
            "moecache controller-longer --settings {params.settings:q} --model {params.model:q}"
            f" --sequences {{input.sequences}} --shard {LAST_SHARD} --gates {{input.gates}}"
            " --heads {input.heads} --out-dir {output} > {log} 2>&1"
        )


rule table_controller:
    """The controller appendix table (a placeholder without a `controller` section)."""
    input:
        sweep=controller_sweeps(),
        longer=controller_longer(),
        heads=controller_heads(),
    output:
        report(
            "figures/table_controller.csv",
            caption="../report/table_controller.rst",
            category="Tables",
        ),
        "figures/table_controller_seeds.csv",
        "figures/table_controller_priced.csv",
        "figures/table_controller_longer.csv",
        report(
            "figures/table_controller.md",
            caption="../report/table_controller.rst",
            category="Tables",
        ),
        "figures/table_controller.sources.json",
    log:
        "logs/figures/table_controller.log",
    benchmark:
        "benchmarks/figures/table_controller.tsv"
    conda:
        CONDA_ENV
    shell:
        "moecache table table_controller --sweep {input.sweep} --longer {input.longer}"
        " --controller {input.heads} --out-dir figures > {log} 2>&1"
