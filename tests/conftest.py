"""Shared fixtures: the repo's paths, small configs, and one smoke run of the pipeline."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from moecache import config as configs

# No test may reach a hub; set before any test module imports the Hugging Face libraries.
for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ[_name] = "1"
# Under pytest-xdist each worker takes a core: one thread each for torch's and numpy's maths
# (jobs that set their own threads, as the pipeline's do, still do).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SMOKE = REPO / "config" / "smoke.yaml"
# The tiny MoE every family is built at in the family tests: 16 experts, top-4, 3 layers.
TINY_ARCH = {
    "hidden_size": 32,
    "intermediate_size": 16,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "max_position_embeddings": 64,
}
# A harness on the CPU for those tests: one thread, no throughput gate (speed is not what
# they check); each adds its restricted layers and capacity.
TINY_HARNESS = configs.with_defaults(
    {
        "device": "cpu",
        "threads": 1,
        "warmup_tokens": 2,
        "gate_repeats": 1,
        "link_ring_mib": 1,
        "min_throughput_ratio": 0.0,
    },
    "harness",
)


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def load_settings(path: Path) -> dict:
    """A config file as a stage reads it: its defaults filled in (not checked: a test may
    cut it down first)."""
    return configs.fill_defaults(load_yaml(path))


@pytest.fixture
def smoke_config() -> dict:
    """config/smoke.yaml as a stage reads it: its defaults filled in."""
    return configs.fill_defaults(load_yaml(SMOKE))


def env() -> dict:
    """The environment a user's shell would have after `make venv`: the venv on PATH."""
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}


def snakemake(workdir: Path, *args: str, configfile: Path = SMOKE, check=True):
    # Targets and multi-value options first: --configfile would swallow a target after it.
    cmd = [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "--directory", str(workdir)]
    cmd += [*args, "--configfile", str(configfile)]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env())
    if check and result.returncode:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def moecache(*args: str, check=False) -> subprocess.CompletedProcess:
    """`moecache ARGS` as a finished process: its exit status, stdout and stderr. Run in this
    process through the console script's function (cli.main), since starting Python and
    torch for each call took minutes of the suite; a real subprocess when
    MOECACHE_TEST_SUBPROCESS is set, or from a thread (stdout and stderr are the process's)."""
    if os.environ.get("MOECACHE_TEST_SUBPROCESS") or threading.current_thread() is not (
        threading.main_thread()
    ):
        return subprocess.run(
            [str(BIN / "moecache"), *args], capture_output=True, text=True, env=env(), check=check
        )
    from moecache import cli

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main([str(arg) for arg in args])
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
    result = subprocess.CompletedProcess(["moecache", *args], code, out.getvalue(), err.getvalue())
    if check:
        result.check_returncode()
    return result


# Fixtures that run a pipeline through Snakemake: a test that uses one, directly or through
# another fixture, is a pipeline test (`pytest -m "not pipeline"` leaves it out). Under
# pytest-xdist (`make pytest` runs `-n auto --dist loadgroup`) the tests of one fixture form a
# group that one worker runs, so each pipeline runs once per session, not once per worker.
PIPELINE_FIXTURES = ("smoke_run", "rehearsal_run", "qwen3_run")


def pytest_collection_modifyitems(config, items):
    for item in items:
        used = [name for name in PIPELINE_FIXTURES if name in getattr(item, "fixturenames", ())]
        if used:
            item.add_marker(pytest.mark.pipeline)
            item.add_marker(pytest.mark.xdist_group(used[0]))
            if getattr(config.option, "loadgroup", False):  # set on xdist workers only
                in_group(item, used[0])


def in_group(item, group: str) -> None:
    """What xdist 3.8's loadgroup does to a grouped test's id ("<id>@<group>": its scheduler
    sends every id with that suffix to one worker), which it writes to `item._nodeid`, a
    name pytest 9 no longer reads: the id lives in `item._id` (a NodeId)."""
    from _pytest.nodeid import coerce_node_id

    item._id = coerce_node_id(f"{item.nodeid}@{group}")


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> Path:
    """The smoke config through Snakemake, once per test session (in MOECACHE_SMOKE_DIR
    when set, so that a developer can reuse an earlier run: Snakemake reruns what changed)."""
    reuse = os.environ.get("MOECACHE_SMOKE_DIR")
    workdir = Path(reuse) if reuse else tmp_path_factory.mktemp("smoke")
    snakemake(workdir, "all", "--cores", "1", "--resources", "gpu=1")
    return workdir
