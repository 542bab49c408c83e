"""Where trace replay's results lie: `results/replay/<shard>/<name>.json` at the trace run's
capacity, `results/replay/<shard>/c<C>/<name>.json` at every other capacity of
`replay.capacities`. Each file states its own capacity, so readers take C from it."""

from __future__ import annotations

import re
from pathlib import Path

from moecache.records.io import read_record
from moecache.records.replay import BY_NAME

OTHER_CAPACITY = re.compile(r"c[0-9]+")


def shard_of(path) -> str:
    """The shard of a replay, bound or foresight file, from its folder."""
    folder = Path(path).parent
    return folder.parent.name if OTHER_CAPACITY.fullmatch(folder.name) else folder.name


def found(workdir, name: str, shards) -> list[tuple[str, int, Path]]:
    """(shard, capacity, path) of every `name` file under `workdir`, by shard in the
    given order, then by capacity."""
    rows = []
    for shard in shards:
        folder = Path(workdir) / "results/replay" / shard
        paths = [folder / f"{name}.json", *sorted(folder.glob(f"c*/{name}.json"))]
        for path in paths:
            if path.exists() and shard_of(path) == shard:
                rows.append((shard, int(read_record(path, BY_NAME[name]).capacity), path))
    return sorted(rows, key=lambda row: (list(shards).index(row[0]), row[1]))
