# A router fine-tuned for cache hits (config section `router_tuning`): each variant
# fine-tuned with trl and LoRA, merged into safetensors weights, then every model (the
# untuned base too) measured in the harness; Table 3 from those measurements.


include: "../helpers/router_tuning.smk"


wildcard_constraints:
    variant="sft|hit|tag|harness",
    measured="base|sft|hit|tag|harness",


rule router_train:
    input:
        model=built("results/model") if ROUTER_EMBEDDED else [],
        tokenizer=(built("results/tokenizer") if ROUTER_EMBEDDED else []),
        text="results/corpus/train.parquet",
    output:
        directory("results/router_tuning/{variant}"),
    log:
        "logs/router_tuning/train/{variant}.log",
    benchmark:
        "benchmarks/router_tuning/train/{variant}.tsv"
    conda:
        CONDA_ENV
    threads: ROUTER.get("threads", 1)
    resources:
        gpu=untimed_gpu(),
    params:
        settings=settings("corpus", "model", "harness", "router_tuning"),
        model=router_base("model"),
        tokenizer=router_base("tokenizer"),
    shell:
        "moecache router-train --settings {params.settings:q} --variant {wildcards.variant}"
        " --model {params.model:q} --tokenizer {params.tokenizer:q} --text {input.text}"
        " --out-dir {output} > {log} 2>&1"


rule router_measure:
    input:
        model=router_model,
        tokenizer=(built("results/tokenizer") if ROUTER_EMBEDDED else []),
        sequences=f"results/heldout/{FIRST_SHARD}.parquet",
    output:
        "results/router_tuning/measured/{measured}.json",
    log:
        "logs/router_tuning/measure/{measured}.log",
    benchmark:
        "benchmarks/router_tuning/measure/{measured}.tsv"
    conda:
        CONDA_ENV
    threads: timed_threads()
    resources:
        gpu=1,
    params:
        settings=settings("corpus", "model", "harness", "router_tuning"),
        model=router_model_path,
        tokenizer=router_tokenizer_path,
    shell:
        timed(
            "moecache router-measure --settings {params.settings:q} --name {wildcards.measured}"
            " --model {params.model:q} --tokenizer {params.tokenizer:q}"
            " --sequences {input.sequences} --out {output} > {log} 2>&1",
            ROUTER.get("threads", 1),
        )


rule router_table3:
    """Table 3 from the measurements (a placeholder without a `router_tuning` section)."""
    input:
        router_measured(),
    output:
        report(
            "figures/table3.csv",
            caption="../report/table3.rst",
            category="Tables",
        ),
        report(
            "figures/table3.md",
            caption="../report/table3.rst",
            category="Tables",
        ),
        "figures/table3.sources.json",
    log:
        "logs/figures/table3.log",
    benchmark:
        "benchmarks/figures/table3.tsv"
    conda:
        CONDA_ENV
    shell:
        "moecache table table3 --router {input} --out-dir figures > {log} 2>&1"
