"""How a timed job claims cores (schedule/threads.py): every local core, so that it runs
alone; on a cluster and inside a cluster's job the threads it was submitted with; its math
libraries' threads pinned to what its config names."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from snakemake.exceptions import WorkflowError

from moecache.schedule import threads


class NoCores:
    local_exec, remote_exec = True, False

    @property
    def cores(self):
        raise WorkflowError("no --cores")


@pytest.mark.parametrize(
    ("workflow", "claimed"),
    [
        (SimpleNamespace(local_exec=True, remote_exec=False, cores=2), 2),  # make run
        (SimpleNamespace(local_exec=True, remote_exec=False, cores=1), 1),  # --cores 1
        (SimpleNamespace(local_exec=False, remote_exec=False, cores=64), 1),  # submitting
        (SimpleNamespace(local_exec=True, remote_exec=True, cores=8), 1),  # inside a job
        (NoCores(), 1),  # a lint or a dry run
    ],
)
def test_a_timed_job_claims_every_local_core_and_only_there(workflow, claimed):
    assert threads.claim_every_core(workflow, 1) == claimed


def test_the_math_libraries_keep_the_configs_threads():
    command = threads.pinned("moecache gates --out x", 3)
    assert command.startswith("env ") and command.endswith(" moecache gates --out x")
    assert all(f"{name}=3" in command for name in threads.THREAD_VARIABLES)
