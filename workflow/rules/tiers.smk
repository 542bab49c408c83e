# Tiers (docs/tiers.md, issue 40 point 4): the trace run's demand replayed over a disk tier
# and over host compute, on the grid of tiers.grid, for the report's verdicts, table and
# figure. CPU only. Without tiers.grid there is no job here.
TIERS_GRID = config.get("tiers", {}).get("grid")
TIERS_SHARDS = (TIERS_GRID or {}).get("shards", TRACE_SHARDS)


def tiers_grid():
    """The tiered replays' grid, when the config has tiers.grid."""
    return ["results/tiers/grid.json"] if TIERS_GRID else []


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
