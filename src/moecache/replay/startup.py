"""The replay command's start-up beside a ten-line bigrig script (issue 50, point 6): both
end to end as subprocesses, so imports, reading the trace and the replay all count, as a
user meets them. `moecache replay --trace T --per-request --rule lru` against the script
below, which reads the same harness trace with pyarrow and replays each stream with bigrig
0.9.1's LRU. Runs alternate (which goes first alternating too) after an untimed first
of each; the misses must agree. The ratio is our seconds over bigrig's, summed over the
rounds, with a bootstrap interval over rounds; the target is 1.5 or less.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from moecache import intervals
from moecache.errors import MoecacheError
from moecache.records.demand import Demand

TARGET = 1.5  # our seconds over the script's, end to end (issue 50)

# What a bigrig user writes to count a harness trace's LRU misses, one request at a time.
SCRIPT = """\
import sys
import pyarrow.parquet as pq
from bigrig_engine import pool
table = pq.read_table(sys.argv[1], columns=["sequence", "layer", "requested"]).to_pydict()
streams = {}
for seq, layer, experts in zip(table["sequence"], table["layer"], table["requested"]):
    streams.setdefault((layer, seq), []).extend(experts)
capacity, experts = int(sys.argv[2]), int(sys.argv[3])
print(sum(pool.simulate(s, capacity, experts, pool.LRU)["misses"] for s in streams.values()))
"""


def commands(trace: Path, script: Path, capacity: int, experts: int) -> dict[str, list[str]]:
    """The two command lines, on this interpreter."""
    return {
        "moecache": [
            *(sys.executable, "-m", "moecache", "replay", "--trace", str(trace)),
            *("--capacity", str(capacity), "--per-request", "--rule", "lru", "--json"),
        ],
        "bigrig": [sys.executable, str(script), str(trace), str(capacity), str(experts)],
    }


def timed(command: list[str]) -> tuple[float, str]:
    """Seconds from start to exit, and what it printed."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise MoecacheError(f"{command[1]} exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return seconds, done.stdout


def misses(tool: str, printed: str) -> int:
    if tool == "bigrig":
        return int(printed.split()[-1])
    return json.loads(printed)["rules"]["lru"]["totals"]["insertions"]


def run(trace: Path, capacity: int, experts: int, rounds: int, seed: int = 0) -> dict:
    """Both tools end to end on `trace`, interleaved for `rounds` rounds."""
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "bigrig_lru.py"
        script.write_text(SCRIPT)
        lines = commands(trace, script, capacity, experts)
        counted = {tool: misses(tool, timed(line)[1]) for tool, line in lines.items()}
        if len(set(counted.values())) > 1:
            raise MoecacheError(f"start-up: the tools disagree on LRU's misses: {counted}")
        seconds = {tool: [] for tool in lines}
        for round_ in range(rounds):
            for tool in list(lines)[:: 1 if round_ % 2 == 0 else -1]:
                seconds[tool].append(timed(lines[tool])[0])
    ours, theirs = seconds["moecache"], seconds["bigrig"]
    ratio = sum(ours) / sum(theirs)
    return {
        "trace": str(trace),
        "capacity": capacity,
        "rule": "lru",
        "misses": counted["moecache"],
        "rounds": rounds,
        "moecache_command": "moecache replay --trace T --capacity C --per-request --rule lru",
        "bigrig_script": SCRIPT,
        **{tool: summary(timings) for tool, timings in seconds.items()},
        "ratio": ratio,  # our seconds over bigrig's
        "ratio_interval": intervals.bootstrap_ratio(ours, theirs, seed),
        "target": TARGET,
        "within_target": ratio <= TARGET,
    }


def summary(seconds: list[float]) -> dict:
    return {
        "seconds": seconds,
        "median_seconds": statistics.median(seconds),
        "best_seconds": min(seconds),
    }


def write_trace(demand: Demand, path: Path) -> Path:
    """`demand` as a harness trace (what `moecache decode` records), for a start-up timed on
    the benchmark's own demand: probabilities 1/k on the requested experts."""
    from moecache.records import trace

    rows = []
    for s, stream in enumerate(demand.streams):
        layer = int(stream.split("/")[0].removeprefix("layer"))
        for t, requested in enumerate(demand.requests[s, : demand.lengths[s]].tolist()):
            probs = np.zeros(demand.num_experts, dtype=np.float32)
            probs[requested] = 1 / demand.top_k
            rows.append(
                {
                    **{"sequence": demand.sequences[s], "layer": layer, "token": t},
                    **{"requested": requested, "used": requested, "copied": []},
                    **{"refreshed": False, "decide_seconds": 0.0, "probs": probs},
                }
            )
    trace.write(rows, path, {"run": "benchmark-per-request"})
    return path
