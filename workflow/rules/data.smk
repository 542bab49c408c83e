# The text: training documents and disjoint held-out shards, then their token sequences.


include: "../helpers/data.smk"


rule corpus:
    output:
        corpus_outputs(),
    log:
        "logs/corpus.log",
    benchmark:
        "benchmarks/corpus.tsv"
    conda:
        CONDA_ENV
    params:
        settings=settings("corpus"),
    shell:
        "moecache corpus --settings {params.settings:q} --out-dir results/corpus > {log} 2>&1"


rule heldout:
    input:
        text="results/corpus/shard-{shard}.parquet",
        tokenizer=built("results/tokenizer"),
    output:
        "results/heldout/{shard}.parquet",
    log:
        "logs/heldout/{shard}.log",
    benchmark:
        "benchmarks/heldout/{shard}.tsv"
    conda:
        CONDA_ENV
    params:
        settings=settings("corpus"),
        tokenizer=built_or_pretrained("tokenizer"),
    shell:
        "moecache heldout --settings {params.settings:q} --tokenizer {params.tokenizer:q}"
        " --text {input.text} --out {output} > {log} 2>&1"
