# moecache: expert-cache policies for MoE offloading, measured end to end.
# Thin on purpose: the config is validated in common.smk, each stage's rules live in
# workflow/rules/ (their helpers in workflow/helpers/), and every rule calls the `moecache`
# command line.
from snakemake.utils import min_version

min_version("9.0")


# The embedded default, unless --configfile names another: Snakemake would otherwise merge
# the two, and a study's runs would mix with the default's.
if not config:

    configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


# A study from a routing trace alone (`trace: PATH`, config/trace.yaml): the replay stage and
# the tables it feeds, no model (workflow/trace_study.smk).
if "trace" in config:

    include: "workflow/trace_study.smk"

else:

    include: "workflow/rules/common.smk"
    include: "workflow/rules/data.smk"
    include: "workflow/rules/model.smk"
    include: "workflow/rules/harness.smk"
    include: "workflow/rules/replay.smk"
    include: "workflow/rules/learned.smk"
    include: "workflow/rules/router_tuning.smk"
    include: "workflow/rules/controller.smk"
    include: "workflow/rules/accuracy.smk"
    include: "workflow/rules/report.smk"
    include: "workflow/rules/tiers_harness.smk"


rule all:
    default_target: True
    input:
        final_outputs(),
