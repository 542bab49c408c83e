"""The package is laid out by stage, one folder per Snakemake rule file, and trace replay
runs without torch."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

STAGES = (
    "data",
    "model",
    "harness",
    "replay",
    "learned",
    "router_tuning",
    "controller",
    "accuracy",
    "report",
)


def test_one_folder_per_rule_file():
    package = REPO / "src" / "moecache"
    rules = {path.stem for path in (REPO / "workflow" / "rules").glob("*.smk")}
    assert rules - {"common"} == set(STAGES)
    # A stage's helpers sit beside it, named after it (workflow/helpers/<stage>.smk).
    helpers = {path.stem for path in (REPO / "workflow" / "helpers").glob("*.smk")}
    assert helpers and helpers <= set(STAGES)
    for stage in STAGES:
        assert (package / stage / "__init__.py").is_file()
        # Its commands are the command line's, a module named after it (cli/<stage>.py).
        assert (package / "cli" / f"{stage}.py").is_file()
    loose = {path.stem for path in package.glob("*.py")}
    assert loose == {
        "__init__",
        "__main__",
        "atomic",
        "errors",
        "gpu",
        "intervals",
        "provenance",
        "runs",
    }


def test_replay_runs_without_torch():
    code = (
        "import sys, pkgutil, importlib, moecache.replay as r, moecache.records as d\n"
        "for p in (r, d):\n"
        "    for m in pkgutil.iter_modules(p.__path__):\n"
        "        importlib.import_module(f'{p.__name__}.{m.name}')\n"
        "import moecache.policies\n"
        "print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
