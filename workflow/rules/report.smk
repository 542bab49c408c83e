# The paper's tables and figures, rebuilt from the results files; cheap, so run locally.


include: "../helpers/report.smk"


localrules:
    table1,
    table_eviction,
    table_bounds,
    table_replication,
    fig1,
    fig2,
    fig_causal,
    table_tiers,
    fig_tiers,
    claims,


rule table1:
    input:
        runs=runs_at_1x(FIRST_SHARD),
        scaled=scaled_runs(),
        bandwidth=BANDWIDTH,
        gpu_check=GPU_CHECKS,
    output:
        report(
            "figures/table1_policies.csv",
            caption="../report/table1.rst",
            category="Tables",
        ),
        report(
            "figures/table1_devices.csv",
            caption="../report/table1.rst",
            category="Tables",
        ),
        report(
            "figures/table1_cost_model.csv",
            caption="../report/table1.rst",
            category="Tables",
        ),
        report(
            "figures/table1.md",
            caption="../report/table1.rst",
            category="Tables",
        ),
        "figures/table1.sources.json",
    log:
        "logs/figures/table1.log",
    benchmark:
        "benchmarks/figures/table1.tsv"
    conda:
        CONDA_ENV
    shell:
        "moecache table table1 --runs {input.runs} --scaled {input.scaled}"
        " --bandwidth {input.bandwidth} --gpu-check {input.gpu_check}"
        " --out-dir figures > {log} 2>&1"


rule table_eviction:
    input:
        replay=replayed_all("replay"),
        learned=learned_evaluation() + learned_causal(),
    output:
        report(
            "figures/table_eviction.csv",
            caption="../report/table_eviction.rst",
            category="Tables",
        ),
        report(
            "figures/table_eviction.md",
            caption="../report/table_eviction.rst",
            category="Tables",
        ),
        "figures/table_eviction.sources.json",
    log:
        "logs/figures/table_eviction.log",
    benchmark:
        "benchmarks/figures/table_eviction.tsv"
    conda:
        CONDA_ENV
    shell:
        "moecache table table_eviction --replay {input.replay} --learned {input.learned}"
        " --out-dir figures > {log} 2>&1"


rule table_bounds:
    input:
        bound=replayed_all("bound"),
        sweep="results/replay/optimum-sweep.json",
    output:
        report(
            "figures/table_bounds.csv",
            caption="../report/table_bounds.rst",
            category="Tables",
        ),
        "figures/table_bounds_sweep.csv",
        report(
            "figures/table_bounds_mixed_precision.csv",
            caption="../report/table_bounds_mixed_precision.rst",
            category="Tables",
        ),
        report(
            "figures/table_bounds.md",
            caption="../report/table_bounds.rst",
            category="Tables",
        ),
        "figures/table_bounds.sources.json",
    log:
        "logs/figures/table_bounds.log",
    benchmark:
        "benchmarks/figures/table_bounds.tsv"
    conda:
        CONDA_ENV
    shell:
        "moecache table table_bounds --bound {input.bound} --sweep {input.sweep}"
        " --out-dir figures > {log} 2>&1"


rule table_replication:
    input:
        runs=runs_at_1x(FIRST_SHARD),
        replication=runs_at_1x(SECOND_SHARD) if SECOND_SHARD else [],
    output:
        report(
            "figures/table_replication.csv",
            caption="../report/table_replication.rst",
            category="Tables",
        ),
        report(
            "figures/table_replication.md",
            caption="../report/table_replication.rst",
            category="Tables",
        ),
        "figures/table_replication.sources.json",
    log:
        "logs/figures/table_replication.log",
    benchmark:
        "benchmarks/figures/table_replication.tsv"
    conda:
        CONDA_ENV
    shell:
        "moecache table table_replication --runs {input.runs}"
        " --replication {input.replication} --out-dir figures > {log} 2>&1"


rule fig1:
    input:
        runs=runs_at_1x(FIRST_SHARD),
        scaled=scaled_runs(),
        bandwidth=BANDWIDTH,
    output:
        "figures/fig1.pdf",
        report("figures/fig1.png", caption="../report/fig1.rst", category="Figures"),
        "figures/fig1.sources.json",
    log:
        "logs/figures/fig1.log",
    benchmark:
        "benchmarks/figures/fig1.tsv"
    conda:
        CONDA_ENV
    shell:
        "moecache figure fig1 --runs {input.runs} --scaled {input.scaled}"
        " --bandwidth {input.bandwidth} --out-dir figures > {log} 2>&1"


rule fig2:
    input:
        foresight=replayed_all("foresight", TRACE_SHARDS[:1]),
        learned=learned_evaluation(),
    output:
        "figures/fig2.pdf",
        report("figures/fig2.png", caption="../report/fig2.rst", category="Figures"),
        "figures/fig2.sources.json",
    log:
        "logs/figures/fig2.log",
    benchmark:
        "benchmarks/figures/fig2.tsv"
    conda:
        CONDA_ENV
    shell:
        "moecache figure fig2 --foresight {input.foresight} --learned {input.learned}"
        " --out-dir figures > {log} 2>&1"


rule table_batching:
    input:
        replay=replayed_batched(),
        batched=batched_outputs(),
    output:
        report(
            "figures/table_batching_replay.csv",
            caption="../report/table_batching.rst",
            category="Tables",
        ),
        report(
            "figures/table_batching_harness.csv",
            caption="../report/table_batching.rst",
            category="Tables",
        ),
        report(
            "figures/table_batching.md",
            caption="../report/table_batching.rst",
            category="Tables",
        ),
        "figures/table_batching.sources.json",
    log:
        "logs/figures/table_batching.log",
    benchmark:
        "benchmarks/figures/table_batching.tsv"
    conda:
        CONDA_ENV
    shell:
        "moecache table table_batching --replay {input.replay} --batched {input.batched}"
        " --out-dir figures > {log} 2>&1"


rule fig_batching:
    input:
        replay=replayed_batched(),
        batched=batched_outputs(),
    output:
        "figures/fig_batching.pdf",
        report(
            "figures/fig_batching.png",
            caption="../report/fig_batching.rst",
            category="Figures",
        ),
        "figures/fig_batching.sources.json",
    log:
        "logs/figures/fig_batching.log",
    benchmark:
        "benchmarks/figures/fig_batching.tsv"
    conda:
        CONDA_ENV
    shell:
        "moecache figure fig_batching --replay {input.replay} --batched {input.batched}"
        " --out-dir figures > {log} 2>&1"


rule fig_overlap:
    input:
        runs=runs_at_1x(FIRST_SHARD),
        scaled=scaled_runs(),
    output:
        "figures/fig_overlap.pdf",
        report(
            "figures/fig_overlap.png",
            caption="../report/fig_overlap.rst",
            category="Figures",
        ),
        "figures/fig_overlap.sources.json",
    log:
        "logs/figures/fig_overlap.log",
    benchmark:
        "benchmarks/figures/fig_overlap.tsv"
    conda:
        CONDA_ENV
    shell:
        "moecache figure fig_overlap --runs {input.runs} --scaled {input.scaled}"
        " --out-dir figures > {log} 2>&1"


rule fig_causal:
    """The causal rules' share of the gap against C (learned.causal)."""
    input:
        learned=learned_causal(),
    output:
        "figures/fig_causal.pdf",
        report(
            "figures/fig_causal.png",
            caption="../report/fig_causal.rst",
            category="Figures",
        ),
        "figures/fig_causal.sources.json",
    log:
        "logs/figures/fig_causal.log",
    benchmark:
        "benchmarks/figures/fig_causal.tsv"
    conda:
        CONDA_ENV
    shell:
        "moecache figure fig_causal --learned {input.learned} --out-dir figures > {log} 2>&1"


rule table_tiers:
    """The tiers' grid, farthest-future against LRU, always against bypass (tiers.grid)."""
    input:
        tiers_grid=tiers_grid(),
        tiers_measured=tiers_harness(),
    output:
        report(
            "figures/table_tiers.csv",
            caption="../report/table_tiers.rst",
            category="Tables",
        ),
        "figures/table_tiers_ff_vs_lru.csv",
        "figures/table_tiers_break_even.csv",
        report(
            "figures/table_tiers.md",
            caption="../report/table_tiers.rst",
            category="Tables",
        ),
        "figures/table_tiers.sources.json",
    log:
        "logs/figures/table_tiers.log",
    benchmark:
        "benchmarks/figures/table_tiers.tsv"
    conda:
        CONDA_ENV
    shell:
        "moecache table table_tiers --tiers-grid {input.tiers_grid}"
        " --tiers-measured {input.tiers_measured} --out-dir figures"
        " > {log} 2>&1"


rule fig_tiers:
    """ms per token against C and H, a line per rule x admission (tiers.grid)."""
    input:
        tiers_grid=tiers_grid(),
    output:
        "figures/fig_tiers.pdf",
        report(
            "figures/fig_tiers.png",
            caption="../report/fig_tiers.rst",
            category="Figures",
        ),
        "figures/fig_tiers.sources.json",
    log:
        "logs/figures/fig_tiers.log",
    benchmark:
        "benchmarks/figures/fig_tiers.tsv"
    conda:
        CONDA_ENV
    shell:
        "moecache figure fig_tiers --tiers-grid {input.tiers_grid} --out-dir figures"
        " > {log} 2>&1"


rule claims:
    """The reproduction scorecard: each quantitative claim of the paper against this run's
    results files (every results output of `all`, so it runs after them)."""
    input:
        results=[path for path in final_outputs() if not path.startswith("figures/")],
    output:
        report(
            "figures/claims.csv",
            caption="../report/claims.rst",
            category="Scorecard",
        ),
        "figures/claims.md",
        "figures/claims.sources.json",
    log:
        "logs/figures/claims.log",
    benchmark:
        "benchmarks/figures/claims.tsv"
    conda:
        CONDA_ENV
    params:
        shards=SHARDS,
    shell:
        "moecache claims --workdir . --shards {params.shards} --out-dir figures > {log} 2>&1"


rule numbers:
    """The measured numbers the README quotes, one marked section each (figures/numbers.md;
    `make publish` copies them to docs/results/ and refreshes the blocks of README.md and
    docs/*.md). It needs every other final output, so it runs last and its runtime section
    sums every other job's benchmark."""
    input:
        profile="results/profile/model.json",
        model=built("results/model"),
        gates=expand("results/gates/{shard}.json", shard=SHARDS),
        bandwidth=BANDWIDTH,
        gpu_check=GPU_CHECKS,
        runs=runs_at_1x(FIRST_SHARD),
        cost_model="figures/table1_cost_model.csv",
        replay=replay_outputs(),
        others=[path for path in final_outputs() if path != "figures/numbers.md"],
    output:
        "figures/numbers.md",
    log:
        "logs/figures/numbers.log",
    benchmark:
        "benchmarks/figures/numbers.tsv"
    localrule: True
    conda:
        CONDA_ENV
    params:
        shards=SHARDS,
    shell:
        "moecache numbers --workdir . --shards {params.shards} --runs {input.runs}"
        " --bandwidth {input.bandwidth} --gpu-check {input.gpu_check}"
        " --out {output} > {log} 2>&1"
