"""libCacheSim on the same demand, flattened to single requests: the reference the replay
is checked and timed against.

Every stream becomes consecutive single requests (a token's experts in recorded order), all
streams one after another with their own key space. One cache of C objects then behaves
like a separate pool per stream: an earlier stream's keys are never requested again, so
LRU ages them out first and Belady sees them as never used again. Belady reads the next
request of each object from libCacheSim's oracleGeneral binary format.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from moecache.policies import ZOO
from moecache.records.demand import PAD, Demand

# libCacheSim's oracleGeneral record: timestamp, object id, size, next access (virtual time).
RECORD = np.dtype([("time", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])
# Our rule -> libCacheSim's cache of the same algorithm (the zoo's map: moecache.policies).
ALGORITHMS = {"lru": "LRU", "farthest-future": "Belady", **ZOO}
# Below these capacities libCacheSim 0.3.5 cannot run the algorithm as published: its
# queues round to zero slots and admit nothing (2Q, SLRU, W-TinyLFU's 1% window), or the
# cache refuses to start (S3-FIFO's 10% small queue), so there is nothing to compare.
MIN_CAPACITY = {"two-q": 4, "slru": 4, "s3-fifo": 20, "w-tinylfu": 100}


def runs(rule: str, capacity: int) -> bool:
    """Whether libCacheSim runs `rule`'s algorithm at `capacity` as published."""
    return capacity >= MIN_CAPACITY.get(rule, 1)


def flat_keys(demand: Demand) -> np.ndarray:
    """All requests in order, stream after stream; stream s's expert e is key s * N + e + 1."""
    keys = (
        demand.requests + (np.arange(len(demand.streams)) * demand.num_experts + 1)[:, None, None]
    )
    return keys[demand.requests != PAD]


def write_oracle_general(keys: np.ndarray, path: Path) -> None:
    records = np.zeros(len(keys), dtype=RECORD)
    records["time"] = np.arange(len(keys))
    records["id"] = keys
    records["size"] = 1
    # Next access of each request: scan the keys' positions in order, grouped by key.
    order = np.lexsort((np.arange(len(keys)), keys))
    nxt = np.full(len(keys), -1, dtype=np.int64)
    same = keys[order[1:]] == keys[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    records["next"] = nxt
    records.tofile(path)


@contextmanager
def oracle_trace(demand: Demand) -> Iterator[tuple[Path, int]]:
    """The demand flattened into a temporary oracleGeneral file, and its request count:
    written once, so a benchmark's rounds time libCacheSim's walk and not our writer."""
    keys = flat_keys(demand)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "demand.oracleGeneral.bin"
        write_oracle_general(keys, path)
        yield path, len(keys)


def simulate(trace: tuple[Path, int], capacity: int, rule: str) -> tuple[int, float]:
    """libCacheSim's misses on an oracle trace, and the seconds from opening the reader to
    the result."""
    import libcachesim

    path, requests = trace
    start = time.perf_counter()
    reader = libcachesim.TraceReader(str(path), libcachesim.TraceType.ORACLE_GENERAL_TRACE)
    cache = getattr(libcachesim, ALGORITHMS[rule])(cache_size=capacity)
    ratio, _ = cache.process_trace(reader)
    return round(ratio * requests), time.perf_counter() - start


def misses(demand: Demand, capacity: int, rule: str) -> int:
    """libCacheSim's misses on the flattened demand."""
    with oracle_trace(demand) as trace:
        return simulate(trace, capacity, rule)[0]
