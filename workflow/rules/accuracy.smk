# Multiple-choice accuracy through lm-eval (Table 2): one lm-eval task per entry of
# accuracy.tasks, built here from local text, and every row scored on it.


include: "../helpers/accuracy.smk"


rule accuracy_task:
    input:
        documents=expand("results/corpus/shard-{shard}.parquet", shard=SHARDS),
    output:
        "results/accuracy/tasks/{task}/moecache_{task}.yaml",
        "results/accuracy/tasks/{task}/moecache_{task}.jsonl",
    log:
        "logs/accuracy/task/{task}.log",
    benchmark:
        "benchmarks/accuracy/task/{task}.tsv"
    conda:
        CONDA_ENV
    params:
        settings=settings("accuracy"),
    shell:
        "moecache accuracy-task --settings {params.settings:q} --task {wildcards.task}"
        " --documents {input.documents} --out-dir results/accuracy/tasks/{wildcards.task}"
        " > {log} 2>&1"


rule accuracy:
    """Every row of Table 2 on one task, the pooled model scored by lm-eval."""
    input:
        model=built("results/model"),
        tokenizer=built("results/tokenizer"),
        task="results/accuracy/tasks/{task}/moecache_{task}.yaml",
        sweep=controller_sweeps(),
        heads=controller_heads(),
    output:
        questions="results/accuracy/{task}/questions.parquet",
        summary="results/accuracy/{task}/summary.json",
    log:
        "logs/accuracy/{task}.log",
    benchmark:
        "benchmarks/accuracy/{task}.tsv"
    conda:
        CONDA_ENV
    threads: config["harness"]["threads"]
    resources:
        gpu=untimed_gpu(),
    params:
        settings=settings("model", "harness", "controller", "accuracy"),
        model=built_or_pretrained("model"),
        tokenizer=built_or_pretrained("tokenizer"),
    shell:
        "moecache accuracy --settings {params.settings:q} --model {params.model:q}"
        " --tokenizer {params.tokenizer:q} --task {input.task} --sweep {input.sweep}"
        " --heads-dir results/controller/heads --out-dir results/accuracy/{wildcards.task}"
        " > {log} 2>&1"


rule table2:
    """Table 2 from the accuracy summaries (a placeholder without an `accuracy` section)."""
    input:
        accuracy=accuracy_summaries(),
    output:
        report("figures/table2.csv", caption="../report/table2.rst", category="Tables"),
        report(
            "figures/table2.md",
            caption="../report/table2.rst",
            category="Tables",
        ),
        "figures/table2.sources.json",
    log:
        "logs/figures/table2.log",
    benchmark:
        "benchmarks/figures/table2.tsv"
    conda:
        CONDA_ENV
    shell:
        "moecache table table2 --accuracy {input.accuracy} --out-dir figures > {log} 2>&1"
