# The embedded model: tokenizer and tiny OLMoE trained here; then what its copies and tokens cost.


rule tokenizer:
    input:
        "results/corpus/train.parquet",
    output:
        directory("results/tokenizer"),
    log:
        "logs/tokenizer.log",
    benchmark:
        "benchmarks/tokenizer.tsv"
    conda:
        CONDA_ENV
    params:
        settings=settings("tokenizer"),
    shell:
        "moecache tokenizer --settings {params.settings:q} --train {input} --out {output}"
        " > {log} 2>&1"


rule train:
    input:
        train="results/corpus/train.parquet",
        tokenizer="results/tokenizer",
    output:
        directory("results/model"),
    log:
        "logs/train.log",
    benchmark:
        "benchmarks/train.tsv"
    conda:
        CONDA_ENV
    threads: config.get("training", {}).get("threads", 1)
    params:
        settings=settings("model", "training"),
    shell:
        "moecache train --settings {params.settings:q} --tokenizer {input.tokenizer}"
        " --train {input.train} --out {output} > {log} 2>&1"


rule profile_model:
    input:
        model=built("results/model"),
        sequences=f"results/heldout/{SHARDS[0]}.parquet",
    output:
        "results/profile/model.json",
    log:
        "logs/profile_model.log",
    benchmark:
        "benchmarks/profile_model.tsv"
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
            "moecache profile-model --settings {params.settings:q} --model {params.model:q}"
            " --sequences {input.sequences} --out {output} > {log} 2>&1"
        )
