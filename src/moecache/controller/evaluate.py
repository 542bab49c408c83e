"""The controller in the harness, as one more policy behind the common interface.

sweep: every trained heads file at one threshold (or, for `reference`, the simple
restricting runs it is compared with), decoded interleaved by the harness's own decode job
on the first `controller.sweep_sequences` sequences of a shard; each run's results file
gains a `controller` block read from its trace: refreshes, tokens between refreshes and the
heads' share of the measured step.
longer: the paper's open question. Held-out token streams cut into sequences
`controller.longer.tokens` long are decoded whole and cut back into pieces of the standard
length (corpus.heldout.max_tokens), by the controller and the simple policies alike: the
simple policies restart at every piece, so if restarting is their edge, the gap to the
controller narrows on the whole sequences.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pandas as pd

from moecache import config as configs
from moecache.errors import MoecacheError
from moecache.records.controller import LongerSummary
from moecache.records.io import read_run, write_record, write_run
from moecache.runs import RunName, point_name


def run_name(heads: str, threshold: float) -> str:
    return f"{heads}-{point_name(threshold)}"


def controller_run(path, threshold: float, multiplier: int) -> dict:
    params = {"weights": str(path), "threshold": threshold}
    return configs.run_spec("controller", params, multipliers=[multiplier])


def with_runs(settings: dict, runs: dict) -> dict:
    changed = copy.deepcopy(settings)
    changed["harness"]["runs"] = runs
    return changed


def reference_runs(settings: dict, multiplier: int, names=None) -> dict:
    """The compared runs (default controller.compare) at `multiplier`."""
    runs = settings["harness"]["runs"]
    names = names or settings["controller"]["compare"]
    missing = [name for name in names if name not in runs]
    if missing:
        raise MoecacheError(f"controller.compare: {missing[0]} is not a run of harness.runs")
    return {name: {**runs[name], "multipliers": [multiplier]} for name in names}


def controller_block(report: dict, trace_file: Path) -> dict:
    """Refreshes after each sequence's first token, per restricted layer and timed token;
    the heads' seconds over the step seconds of those tokens (`report`: the run's results)."""
    trace = pd.read_parquet(trace_file, columns=["layer", "token", "refreshed", "decide_seconds"])
    timed = trace[trace["token"] > 0]
    layers = timed["layer"].nunique()
    refreshes = int(timed["refreshed"].sum())
    totals = report["totals"]
    step_seconds = totals["timed_tokens"] * totals["step_ms"] / 1e3
    return {
        "refreshes_per_token": refreshes / len(timed) if len(timed) else 0.0,
        "tokens_between_refreshes": len(timed) / refreshes if refreshes else None,
        "layers": layers,
        "heads_ms_per_token": 1e3 * float(timed["decide_seconds"].sum()) / totals["timed_tokens"],
        "heads_share": float(timed["decide_seconds"].sum()) / step_seconds,
    }


def annotate(out_dir: Path) -> None:
    """Add the controller block to every run file in `out_dir` (from its trace)."""
    for run_file in sorted(out_dir.glob("*.json")):
        result = read_run(run_file)
        block = controller_block(result.as_dict(), run_file.with_suffix(".parquet"))
        write_run(run_file, dataclasses.replace(result, controller=block))


def sweep(settings, model_source, sequences_path, shard, gates_path, heads, point, m, out_dir):
    """`heads`: name -> heads file; `point`: a threshold, or "reference"."""
    from moecache.harness import jobs

    if point == "reference":
        runs = reference_runs(settings, m)
    else:
        runs = {
            run_name(name, point): controller_run(path, point, m) for name, path in heads.items()
        }
    changed = with_runs(
        settings, {name: {**spec, "shards": [shard]} for name, spec in runs.items()}
    )
    found = jobs.run_decode(
        changed,
        model_source,
        sequences_path,
        shard,
        shard,
        gates_path,
        out_dir,
        first=settings["controller"]["sweep_sequences"],
    )
    annotate(Path(out_dir))
    return found


def cut(sequences: list[list[int]], length: int, count: int) -> list[list[int]]:
    """`count` sequences of `length` tokens from the held-out sequences laid end to end."""
    stream = [i for ids in sequences for i in ids]
    if len(stream) < length * count:
        raise MoecacheError(
            f"controller.longer: {count} sequences of {length} tokens need {length * count} "
            f"held-out tokens, the shard has {len(stream)}"
        )
    return [stream[i * length : (i + 1) * length] for i in range(count)]


def longer(settings, model_source, sequences_path, shard, gates_path, heads_path, out_dir):
    """Whole and cut: the compared runs and the controller at controller.longer thresholds."""
    from moecache.harness import jobs

    ctl = settings["controller"]
    piece = settings["corpus"]["heldout"]["max_tokens"]
    model, sequences = jobs.load(settings, model_source, sequences_path)
    whole = cut(sequences, ctl["longer"]["tokens"], ctl["longer"]["sequences"])
    pieces = [ids[i : i + piece] for ids in whole for i in range(0, len(ids), piece)]
    runs = reference_runs(settings, 1, ctl["longer"].get("compare")) | {
        run_name("controller", t): controller_run(heads_path, t, 1)
        for t in ctl["longer"]["thresholds"]
    }
    runs = {name: {**spec, "shards": [shard]} for name, spec in runs.items()}
    out_dir = Path(out_dir)
    summary = {"tokens": ctl["longer"]["tokens"], "piece_tokens": piece, "heads": str(heads_path)}
    for label, seqs in (("whole", whole), ("pieces", pieces)):
        found = jobs.run_decode(
            with_runs(settings, runs),
            model_source,
            sequences_path,
            shard,
            shard,
            gates_path,
            out_dir / label,
            loaded=(model, seqs),
        )
        annotate(out_dir / label)
        summary[label] = {
            name: {key: found[str(RunName(name))][key] for key in ("delta_nll", "copies_per_token")}
            for name in runs
        }
    write_record(out_dir / "summary.json", LongerSummary(**summary))
    return summary
