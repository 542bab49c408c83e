"""Which runs a decode job decodes, from the settings that job is given (model and harness
only: no corpus), against the Snakefile's list of every results file (the whole config)."""

from __future__ import annotations

from conftest import REPO, load_settings

from moecache.runs import RunName
from moecache.schedule import runs


def test_a_decode_jobs_settings_name_the_runs_the_workflow_expects():
    config = load_settings(REPO / "config" / "config.yaml")
    job = {"model": config["model"], "harness": config["harness"]}  # as the decode rule passes
    expected = runs.decoded(config, kept=True)
    first = next(iter(config["corpus"]["heldout"]["shards"]))
    for shard in config["corpus"]["heldout"]["shards"]:
        planned = {str(RunName(n, m)) for n, m in runs.shard_runs(job, shard, first)}
        assert planned == {str(name) for s, name in expected if s == shard}
