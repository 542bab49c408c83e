# Trace replay: lossless rules, bounds (the exact B* by LP, and at mixed-precision costs) and
# limited foresight on the recorded demand of the trace run; the exact-optimum sweep; replay
# and LP speed beside libCacheSim. CPU only.


include: "../helpers/replay.smk"


rule replay:
    input:
        trace=TRACE,
    output:
        "results/replay/{shard}/replay.json",
    log:
        "logs/replay/{shard}/replay.log",
    benchmark:
        "benchmarks/replay/{shard}/replay.tsv"
    wildcard_constraints:
        shard="[^/]+",
    conda:
        CONDA_ENV
    params:
        capacity=replay_capacity,
    shell:
        "moecache replay --trace {input.trace} --capacity {params.capacity} --out {output}"
        " > {log} 2>&1"


rule bound:
    input:
        trace=TRACE,
    output:
        "results/replay/{shard}/bound.json",
    log:
        "logs/replay/{shard}/bound.log",
    benchmark:
        "benchmarks/replay/{shard}/bound.tsv"
    wildcard_constraints:
        shard="[^/]+",
    conda:
        CONDA_ENV
    params:
        capacity=replay_capacity,
        share=config["replay"]["mixed_precision"]["share"],
        cost=config["replay"]["mixed_precision"]["cost"],
        seed=config["seed"],
    shell:
        "moecache bound --trace {input.trace} --capacity {params.capacity}"
        " --mixed-share {params.share} --mixed-cost {params.cost} --seed {params.seed}"
        " --out {output} > {log} 2>&1"


rule foresight:
    input:
        trace=TRACE,
    output:
        "results/replay/{shard}/foresight.json",
    log:
        "logs/replay/{shard}/foresight.log",
    benchmark:
        "benchmarks/replay/{shard}/foresight.tsv"
    wildcard_constraints:
        shard="[^/]+",
    conda:
        CONDA_ENV
    params:
        capacity=replay_capacity,
        foresight=" ".join(map(str, config["replay"]["foresight"])),
        heldout=config["replay"]["heldout_sequences"],
    shell:
        "moecache foresight --trace {input.trace} --capacity {params.capacity}"
        " --foresight {params.foresight} --heldout-last {params.heldout} --out {output}"
        " > {log} 2>&1"


rule replay_per_request:
    """LRU and farthest-future counted one request at a time, as other simulators count
    (docs/replay.md, "Per token or per request"), beside replay's per-token counts."""
    input:
        trace=TRACE,
    output:
        "results/replay/{shard}/per-request.json",
    log:
        "logs/replay/{shard}/per-request.log",
    benchmark:
        "benchmarks/replay/{shard}/per-request.tsv"
    wildcard_constraints:
        shard="[^/]+",
    conda:
        CONDA_ENV
    params:
        capacity=replay_capacity,
    shell:
        "moecache replay --trace {input.trace} --capacity {params.capacity} --per-request"
        " --rule lru --rule farthest-future --out {output} > {log} 2>&1"


# The same four at every other capacity of replay.capacities (the paper's C = N/2), under
# results/replay/<shard>/c<C>/; the trace run's own C keeps the shard's folder.


use rule replay as replay_at_capacity with:
    output:
        "results/replay/{shard}/c{capacity}/replay.json",
    log:
        "logs/replay/{shard}/c{capacity}/replay.log",
    benchmark:
        "benchmarks/replay/{shard}/c{capacity}/replay.tsv"
    wildcard_constraints:
        shard="[^/]+",
        capacity="[0-9]+",


use rule bound as bound_at_capacity with:
    output:
        "results/replay/{shard}/c{capacity}/bound.json",
    log:
        "logs/replay/{shard}/c{capacity}/bound.log",
    benchmark:
        "benchmarks/replay/{shard}/c{capacity}/bound.tsv"
    wildcard_constraints:
        shard="[^/]+",
        capacity="[0-9]+",


use rule replay_per_request as replay_per_request_at_capacity with:
    output:
        "results/replay/{shard}/c{capacity}/per-request.json",
    log:
        "logs/replay/{shard}/c{capacity}/per-request.log",
    benchmark:
        "benchmarks/replay/{shard}/c{capacity}/per-request.tsv"
    wildcard_constraints:
        shard="[^/]+",
        capacity="[0-9]+",


use rule foresight as foresight_at_capacity with:
    output:
        "results/replay/{shard}/c{capacity}/foresight.json",
    log:
        "logs/replay/{shard}/c{capacity}/foresight.log",
    benchmark:
        "benchmarks/replay/{shard}/c{capacity}/foresight.tsv"
    wildcard_constraints:
        shard="[^/]+",
        capacity="[0-9]+",


rule replay_batched:
    """Every rule on the union demand of B sequences a step, at the trace run's C."""
    input:
        trace=TRACE,
    output:
        "results/replay/{shard}/batched/b{batch}-{batching}-p{prefill}.json",
    log:
        "logs/replay/{shard}/batched/b{batch}-{batching}-p{prefill}.log",
    benchmark:
        "benchmarks/replay/{shard}/batched/b{batch}-{batching}-p{prefill}.tsv"
    wildcard_constraints:
        shard="[^/]+",
        batch="[0-9]+",
        batching="static|continuous",
        prefill="[0-9]+",
    conda:
        CONDA_ENV
    params:
        capacity=TRACE_CAPACITY,
    shell:
        "moecache replay --trace {input.trace} --capacity {params.capacity}"
        " --batch {wildcards.batch} --batching {wildcards.batching}"
        " --prefill {wildcards.prefill} --out {output} > {log} 2>&1"


rule optimum_sweep:
    output:
        "results/replay/optimum-sweep.json",
    log:
        "logs/replay/optimum-sweep.log",
    benchmark:
        "benchmarks/replay/optimum-sweep.tsv"
    conda:
        CONDA_ENV
    params:
        settings=settings("replay"),
    shell:
        "moecache optimum-sweep --settings {params.settings:q} --out {output} > {log} 2>&1"


rule benchmark_replay:
    output:
        "results/replay/benchmark.json",
    log:
        "logs/replay/benchmark.log",
    benchmark:
        "benchmarks/replay/benchmark.tsv"
    conda:
        CONDA_ENV
    threads: timed_threads()
    params:
        settings=settings("replay"),
    shell:
        timed(
            "moecache benchmark-replay --settings {params.settings:q} --out {output} > {log} 2>&1"
        )


# Tiers (docs/tiers.md, issue 40 point 4): the trace run's demand replayed over a disk tier
# and over host compute, on the grid of tiers.grid, for the report's verdicts, table and
# figure. CPU only. Without tiers.grid there is no job here.


rule tiers_grid:
    """Every rule under every admission at every C over every H, on each shard's trace."""
    input:
        traces=expand(TRACE, shard=TIERS_SHARDS),
    output:
        "results/tiers/grid.json",
    log:
        "logs/tiers/grid.log",
    benchmark:
        "benchmarks/tiers/grid.tsv"
    conda:
        CONDA_ENV
    threads: 1
    params:
        settings=settings("tiers"),
        traces=" ".join(f"{s}={TRACE.format(shard=s)}" for s in TIERS_SHARDS),
    shell:
        "moecache tiers-grid --settings {params.settings:q} --trace {params.traces}"
        " --out {output} > {log} 2>&1"
