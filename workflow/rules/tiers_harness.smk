# The tiers measured for real (issue 40 point 3; docs/tiers.md, "Measured in the harness"):
# the embedded default's restricted layers decoded over device slots, a host cache and the
# disk, on the first shard's first harness.tiers.sequences sequences, and equation (1) with
# a term per tier checked against them. Included after report.smk: it reads GPU_CHECKS
# (report.devices), the first of which prices the device side.

TIERS_HARNESS = f"results/tiers/harness/{DEVICE_TAG}.json"


rule tiers_harness:
    """Prices of a disk read, a copy and a host compute, then the all-resident reference
    and one tiered arm per admission, decoded interleaved (moecache tiers-harness)."""
    input:
        model=built("results/model"),
        sequences=f"results/heldout/{FIRST_SHARD}.parquet",
        gpu_check=GPU_CHECKS[:1],
    output:
        TIERS_HARNESS,
    log:
        f"logs/tiers/harness-{DEVICE_TAG}.log",
    benchmark:
        f"benchmarks/tiers/harness-{DEVICE_TAG}.tsv"
    conda:
        CONDA_ENV
    threads: config["harness"]["threads"]
    resources:
        gpu=1,
    params:
        settings=settings("model", "harness"),
        model=built_or_pretrained("model"),
        gpu_check=lambda wildcards, input: (
            f"--gpu-check {input.gpu_check[0]}" if input.gpu_check else ""
        ),
    shell:
        "moecache tiers-harness --settings {params.settings:q} --model {params.model:q}"
        " --sequences {input.sequences} --out {output} {params.gpu_check} > {log} 2>&1"
