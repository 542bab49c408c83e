"""Which runs each shard decodes, and the slots a decode job holds for them: pure functions
of the validated settings. The harness's decode jobs (harness/runs.py), `moecache plan`
(schedule/accountant.py) and the Snakefile (workflow/helpers/harness.smk) all ask these, so the
files the workflow expects, the runs a job decodes and the memory the plan sizes agree.
"""

from __future__ import annotations

from typing import NamedTuple

from moecache.config.keys import capacity_of, run_decodes_shard, run_multipliers, run_shards
from moecache.policies.all_resident import AllResident
from moecache.runs import RunName

RESIDENT = AllResident.name  # the all-resident policy: a 1x run's reference under fan_out `run`


def decodes(shard: str, multiplier: int, first_shard: str) -> bool:
    """Whether a run on `shard` decodes at `multiplier`: at 1x on each of its shards, at
    its other multipliers on the first shard alone."""
    return multiplier == 1 or shard == first_shard


def shard_runs(settings: dict, shard: str, first_shard: str) -> list[tuple[str, int]]:
    """(run, multiplier) pairs decoded on `shard` (decodes), in harness.runs's order."""
    return [
        (name, m)
        for name, spec in settings["harness"]["runs"].items()
        if run_decodes_shard(spec, shard)
        for m in run_multipliers(spec)
        if decodes(shard, m, first_shard)
    ]


def kept_runs(harness: dict, pairs: list[tuple[str, int]], kept: bool) -> list[tuple[str, int]]:
    """`pairs` less the all-resident runs where the reference is left out (not `kept`)."""
    if kept:
        return pairs
    return [(n, m) for n, m in pairs if harness["runs"][n]["policy"] != RESIDENT]


def decoded(settings: dict, kept: bool) -> list[tuple[str, RunName]]:
    """(shard, run name) of every results file the decode jobs write, run by run: each run x
    shard at 1x, and each run x multiplier on the first shard (slower copies rank the
    policies on the main shard, as in the paper); not the all-resident runs where the device
    cannot hold them (not `kept`: schedule.accountant.reference_left_out)."""
    harness = settings["harness"]
    first = next(iter(settings["corpus"]["heldout"]["shards"]))
    return [
        (shard, RunName(name, m))
        for name, spec in harness["runs"].items()
        for shard in run_shards(spec, settings)
        for m in run_multipliers(spec)
        if decodes(shard, m, first) and kept_runs(harness, [(name, m)], kept)
    ]


def scaled_groups(runs: dict) -> dict[str, list]:
    """Run name -> its runs at a multiplier above 1, in the plan's order (`runs`: label ->
    anything with a name, a multiplier and a capacity, such as harness/runs.py's RunSpec)."""
    groups = {}
    for run in runs.values():
        if run.multiplier > 1:
            groups.setdefault(run.name, []).append(run)
    return groups


def slot_layout(runs: dict) -> tuple[int, list[int]]:
    """The slots per offloaded layer a decode job allocates, as (the storage its 1x runs
    share, decoded one after another: their largest C; each scaled group's, held one group
    at a time once the 1x runs are done: its twin's and each multiplier's C); `moecache
    plan` sizes the job by the same function."""
    shared = max((run.capacity for run in runs.values() if run.multiplier == 1), default=0)
    groups = [(1 + len(group)) * group[0].capacity for group in scaled_groups(runs).values()]
    return shared, groups


class Slots(NamedTuple):
    """A run as slot_layout reads it."""

    name: str
    multiplier: int
    capacity: int


def shard_slots(settings: dict, shard: str, first_shard: str, kept: bool) -> dict[str, Slots]:
    """The runs `shard` decodes, by label in harness.runs's order, as slot_layout reads them
    (harness/runs.py runs_for_shard builds the same runs with their policies)."""
    harness = settings["harness"]
    pairs = kept_runs(harness, shard_runs(settings, shard, first_shard), kept)
    return {
        str(RunName(n, m)): Slots(n, m, capacity_of(harness, harness["runs"][n])) for n, m in pairs
    }
