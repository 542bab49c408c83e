"""Check a run through SLURM against a local run: its jobs went through sbatch, and its
outputs (held-out tokens, model weights, copy counts, NLL, traces) equal the local ones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
from safetensors.torch import load_file

EXACT = ("fills", "steady_copies", "scored_tokens", "timed_tokens")


def main(local: Path, slurm: Path, targets: list[str], pretrained: bool) -> None:
    root = slurm / ".snakemake/slurm_logs"
    logs = sorted(root.rglob("*.log"))
    rules = {log.relative_to(root).parts[0] for log in logs}
    # A pretrained checkpoint is used as it is: no tokenizer or training job.
    built = {"rule_heldout"} if pretrained else {"rule_train"}
    assert built | {"rule_gates", "rule_decode"} <= rules, f"sbatch logs: {rules}"
    assert pretrained != ("rule_train" in rules), f"sbatch logs: {rules}"
    jobs = subprocess.run(
        ["squeue", "--states=all", "-h", "-o", "%i %P %T"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    completed = [line for line in jobs if line.endswith("COMPLETED")]
    assert len(completed) >= len(logs), f"squeue shows {jobs} for {len(logs)} sbatch logs"
    assert any(" gpu " in line for line in completed), f"no job ran on the gpu partition: {jobs}"
    for shard in ("a",):
        a, b = (pd.read_parquet(d / f"results/heldout/{shard}.parquet") for d in (local, slurm))
        assert a.equals(b), f"held-out shard {shard} differs"
    if not pretrained:
        wa, wb = (load_file(d / "results/model/model.safetensors") for d in (local, slurm))
        assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa), "weights"
    for target in targets:
        ra, rb = (json.loads((d / target).read_text()) for d in (local, slurm))
        for key in EXACT:
            assert ra["totals"][key] == rb["totals"][key], f"{target}: {key} differs"
        assert abs(ra["totals"]["nll"] - rb["totals"]["nll"]) < 1e-9, f"{target}: NLL differs"
        trace = target.replace("results/runs", "results/traces").replace(".json", ".parquet")
        ta, tb = (pd.read_parquet(d / trace, columns=["requested", "used"]) for d in (local, slurm))
        assert ta.map(list).equals(tb.map(list)), f"{trace} differs"
    print(f"slurm test: {len(logs)} jobs through sbatch; outputs equal the local run's")


if __name__ == "__main__":
    args = sys.argv[1:]
    pretrained = args[0] == "--pretrained"
    args = args[1:] if pretrained else args
    main(Path(args[0]), Path(args[1]), args[2:], pretrained)
