# moecache: expert-cache policies for MoE offloading, measured end to end.
# Thin on purpose: the config is validated in common.smk, each stage lives in workflow/rules/,
# and every rule calls the `moecache` command line.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/corpus.smk"
include: "workflow/rules/model.smk"


rule all:
    default_target: True
    input:
        final_outputs(),
