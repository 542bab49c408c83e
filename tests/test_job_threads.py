"""How a timed job claims cores (schedule/threads.py): every local core, so that it runs
alone; on a cluster and inside a cluster's job the threads it was submitted with; its math
libraries' threads pinned to what its config names."""

from __future__ import annotations

import re
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


def planned_jobs(workdir, configfile) -> list[dict]:
    """Every job of `all` in a dry run on 2 cores: its rule, threads and resources."""
    from conftest import snakemake

    out = snakemake(
        workdir, "all", "-n", "--cores", "2", "--resources", "gpu=1", configfile=configfile
    )
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", out.stdout):
        rule = re.match(r"(?:local)?rule (\w+):", block)
        if rule:
            threads_line = re.search(r"threads: (\d+)", block)
            gpu = re.search(r"resources: .*\bgpu=(\d+)", block)
            jobs.append(
                {
                    "rule": rule.group(1),
                    "threads": int(threads_line.group(1)) if threads_line else 1,
                    "gpu": int(gpu.group(1)) if gpu else 0,
                }
            )
    return jobs


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_only_timed_jobs_hold_the_gpu_on_a_cpu_and_every_model_job_on_cuda(device, tmp_path):
    """On a CPU the untimed model jobs (the controller's heads, router tuning, the learned
    trace, the accuracy rows) run side by side; a timed job holds `gpu` and every core. On
    CUDA each model job holds the one GPU, its model in the device's memory."""
    import yaml
    from conftest import SMOKE

    config = yaml.safe_load(SMOKE.read_text())
    config["harness"]["device"] = device
    configfile = tmp_path / "config.yaml"
    configfile.write_text(yaml.safe_dump(config))
    jobs = planned_jobs(tmp_path / "work", configfile)
    untimed_models = {"controller_train", "router_train", "learned_trace", "accuracy"}
    assert untimed_models <= {job["rule"] for job in jobs}
    for job in jobs:
        if job["rule"] in untimed_models:
            assert job["gpu"] == (device == "cuda"), job
        elif job["gpu"] and device == "cpu":
            assert job["threads"] == 2, job  # timed: alone
