# The text: training documents and disjoint held-out shards, then their token sequences.


rule corpus:
    output:
        corpus_outputs(),
    params:
        settings=settings("corpus"),
    log:
        "logs/corpus.log",
    benchmark:
        "benchmarks/corpus.tsv"
    conda:
        CONDA_ENV
    shell:
        "moecache corpus --settings {params.settings:q} --out-dir results/corpus > {log} 2>&1"


rule heldout:
    input:
        text="results/corpus/shard-{shard}.parquet",
        tokenizer=built("results/tokenizer"),
    output:
        "results/heldout/{shard}.parquet",
    params:
        settings=settings("corpus"),
        tokenizer=tokenizer_source(),
    log:
        "logs/heldout/{shard}.log",
    benchmark:
        "benchmarks/heldout/{shard}.tsv"
    conda:
        CONDA_ENV
    shell:
        "moecache heldout --settings {params.settings:q} --tokenizer {params.tokenizer:q}"
        " --text {input.text} --out {output} > {log} 2>&1"
