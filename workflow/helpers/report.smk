# The report's inputs beyond the results: the paper's outputs
# and every final output (the target `all`).
PAPER_OUTPUTS = [
    "figures/table1.md",
    *expand("figures/{name}.md", name=["table2", "table3", "table_controller"]),
    "figures/table_eviction.md",
    "figures/table_bounds.md",
    "figures/table_replication.md",
    "figures/fig1.pdf",
    "figures/fig2.pdf",
    "figures/claims.md",
    "figures/numbers.md",
]
# Batched decoding's table and figure, where the config batches (docs/batching.md).
if BATCH_SIZES and config["replay"].get("batch_sizes"):
    PAPER_OUTPUTS += ["figures/table_batching.md", "figures/fig_batching.pdf"]
# The overlap figure, where some run overlaps its copies on the first shard (docs/overlap.md).
if any(
    run.get("overlap") and FIRST_SHARD in configs.run_shards(run, config)
    for run in RUNS.values()
):
    PAPER_OUTPUTS += ["figures/fig_overlap.pdf"]

# The causal rules' figure, where the learned section has a causal part (issue 41).
if learned_causal():
    PAPER_OUTPUTS += ["figures/fig_causal.pdf"]

# The tiers' table and figure, where the config has tiers.grid (issue 40).
if tiers_grid():
    PAPER_OUTPUTS += ["figures/table_tiers.md", "figures/fig_tiers.pdf"]


def final_outputs():
    """Every stage's outputs, then the paper's tables and figures: the target `all`."""
    return [
        *built("results/model"),
        *expand("results/heldout/{shard}.parquet", shard=SHARDS),
        "results/profile/model.json",
        BANDWIDTH,
        *link_check_outputs(),
        f"results/probe/{FIRST_SHARD}.json",
        *decode_outputs(),
        *batched_outputs(),
        *replay_outputs(),
        *learned_evaluation(),
        *learned_causal(),
        *tiers_grid(),
        *tiers_harness(),
        *router_measured(),
        *controller_sweeps(),
        *controller_longer(),
        *accuracy_summaries(),
        *PAPER_OUTPUTS,
    ]
