"""How a pipeline job claims cores: a job whose output holds a timing claims every local
core, so that Snakemake runs it alone while untimed jobs run side by side (`--cores all`),
and computes with the math libraries' threads its config names, not the claimed cores
Snakemake exports (snakemake/shell.py sets OMP_NUM_THREADS and the like to a job's threads).
The rule files call these through `timed_threads` and `timed` (workflow/rules/common.smk,
workflow/trace_study.smk)."""

from __future__ import annotations

# What Snakemake exports as a job's threads, for the math libraries.
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def claim_every_core(workflow, threads: int) -> int:
    """Every local core (at least `threads`); on a cluster, or without --cores (a lint or a
    dry run), the `threads` the job uses: its node's cores are the profile's to give. A job
    a cluster runs reads the Snakefile again on its node (remote execution), where it must
    claim what it was submitted with, not that node's cores."""
    from snakemake.exceptions import WorkflowError

    if workflow.remote_exec or not workflow.local_exec:
        return threads
    try:
        cores = workflow.cores
    except WorkflowError:
        cores = None
    return max(cores or 1, threads)


def pinned(command: str, threads: int) -> str:
    """`command` with the math libraries' threads set to `threads`."""
    pins = " ".join(f"{name}={threads}" for name in THREAD_VARIABLES)
    return f"env {pins} {command}"
