"""The sections on what the harness measured: the model, the gates per shard, copy
bandwidth, the link check, the GPU checks, every run at 1x and Table 1's cost model."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

from moecache.errors import MoecacheError
from moecache.policies.all_resident import AllResident
from moecache.records.bandwidth import BandwidthResult, LinkCheckResult
from moecache.records.gates import GatesResult
from moecache.records.io import read_dict, read_run_dict
from moecache.records.profile import ProfileResult
from moecache.records.training import ModelTraining
from moecache.report.numbers.format import (
    benchmark_seconds,
    cell,
    count,
    duration,
    fixed,
    percent,
    read,
    sig,
    small,
    table,
)
from moecache.runs import at_multiplier


def model_section(workdir: Path) -> str:
    """The trained model, its training, what one copy and one token cost, routing reuse."""
    profile = read_dict(workdir / "results/profile/model.json", ProfileResult)
    rows = []
    training_file = workdir / "results/model/training.json"
    if training_file.exists():  # the embedded model; a pretrained one has no training
        training = read_dict(training_file, ModelTraining)
        parameters = count(training["parameters"])
        config_file = workdir / "results/model/config.json"
        # The embedded model is an OLMoE: every layer sparse, its config's own key names.
        keys = ("num_hidden_layers", "num_experts", "hidden_size", "intermediate_size")
        arch = read(config_file, "a model config") if config_file.exists() else {}
        if all(isinstance(arch.get(key), int) for key in keys):
            # Every layer's experts: gate, up and down projections of hidden x intermediate.
            experts = math.prod(arch[key] for key in keys) * 3
            parameters += f" (expert weights {count(experts)})"
        rows.append(("parameters", parameters))
        steps = len(training["log"])
        train_tsv = workdir / "benchmarks/train.tsv"
        if train_tsv.exists():
            rows.append(
                (
                    "training time",
                    f"{duration(benchmark_seconds(train_tsv))} ({count(steps)} steps, "
                    f"{count(training['tokens_seen'])} tokens)",
                )
            )
        rows.append(("final training loss", f"{fixed(training['log'][-1]['lm_loss'], 3)} nats"))
    scored = profile.get("scored_tokens", profile["timed_tokens"])
    rows += [
        (
            "held-out NLL (first shard)",
            f"{fixed(profile['heldout_nll'], 3)} nats over {count(scored)} scored tokens",
        ),
        ("one expert's weights (gate, up and down)", f"{count(profile['expert_bytes'])} bytes"),
        (
            f"one expert copy, host to device (`{profile['device']}`; the pool's copy path, 1x)",
            f"{sig(profile['expert_copy_ms'])} ms",
        ),
        (
            "one token's compute, batch 1 with KV cache, model's own MoE block",
            f"{sig(profile['token_compute_ms'])} ms",
        ),
        ("one expert copy / one token's compute", percent(profile["copy_share_of_token"], 2)),
        (
            "routing reuse per layer (share of a token's experts the previous token used)",
            ", ".join(fixed(x, 2) for x in profile["reuse_per_layer"]),
        ),
        (
            "the same after shuffling token order",
            ", ".join(fixed(x, 2) for x in profile["reuse_shuffled_per_layer"]),
        ),
    ]
    return table(("measure", "value"), rows)


def gates_section(workdir: Path, shards: Sequence[str]) -> str:
    """Per shard: base NLL both ways, each lossless gate run's NLL difference, throughput."""
    reports = {
        shard: read_dict(workdir / f"results/gates/{shard}.json", GatesResult) for shard in shards
    }
    runs = list(dict.fromkeys(name for r in reports.values() for name in r["runs"]))

    def row(label: str, cell: Callable[[dict], str]) -> list[str]:
        return [label, *(cell(r) for r in reports.values())]

    def run_gap(name: str) -> Callable[[dict], str]:
        def cell(r: dict) -> str:
            if name not in r["runs"]:
                return "n/a"
            return small(abs(r["runs"][name]["nll"] - r["base"]["nll"]))

        return cell

    def ratio(r: dict) -> str:
        low, high = r["throughput_ratio_ci"]
        value = fixed(r["throughput_ratio_pool_vs_own_block"], 2)
        return f"{value} (95% {fixed(low, 2)}-{fixed(high, 2)})"

    rows = [
        row("base NLL, teacher-forced", lambda r: fixed(r["base"]["nll"], 6)),
        row("base NLL, batched full-sequence", lambda r: fixed(r["batched_nll"], 6)),
        row(
            "base NLL, teacher-forced - batched",
            lambda r: small(abs(r["base"]["nll"] - r["batched_nll"])),
        ),
        *(row(f"{name} NLL - base NLL", run_gap(name)) for name in runs),
        row("model's own MoE block, tokens/s", lambda r: fixed(r["base"]["tokens_per_second"], 1)),
        row(
            "pooled block at C = N, tokens/s",
            lambda r: fixed(r["runs"]["all-resident"]["tokens_per_second"], 1),
        ),
        row("throughput ratio pooled / own block", ratio),
        row("floor (`harness.min_throughput_ratio`)", lambda r: f"{r['min_throughput_ratio']:g}"),
    ]
    return table(("measure", *(f"shard {shard}" for shard in shards)), rows)


def bandwidth_section(workdir: Path, files: Sequence[Path] | None = None) -> str:
    """Per device file: tau per multiplier, its ratio to 1x and the per-group overhead; the
    per-expert loop's and one large copy's GiB/s."""
    files = sorted(files or (workdir / "results/bandwidth").glob("*.json"), key=str)
    if not files:
        raise MoecacheError(f"{workdir / 'results/bandwidth'}: no bandwidth files")
    per_multiplier, per_device = [], []
    for path in files:
        r = read_dict(path, BandwidthResult)
        device = f"{Path(path).stem} ({r.get('device_name', 'n/a')})"
        for m in sorted(r["multipliers"], key=float):
            row = r["multipliers"][m]
            per_multiplier.append(
                (
                    device,
                    f"{m}x",
                    sig(row["tau_ms"]),
                    fixed(row["ratio_to_1x"], 2),
                    sig(row["group_overhead_ms"], 2),
                )
            )
        per_device.append(
            (
                device,
                r.get("link", "ring"),
                count(r["expert_bytes"]),
                sig(r["loop_gib_per_s"]),
                sig(r.get("large_gib_per_s")),
            )
        )
    return "\n\n".join(
        [
            table(
                (
                    "device",
                    "multiplier",
                    "tau (ms per expert copy)",
                    "ratio to 1x",
                    "group overhead (ms)",
                ),
                per_multiplier,
            ),
            table(
                (
                    "device",
                    "slower link (harness.slow_link)",
                    "expert bytes",
                    "per-expert copy loop (GiB/s)",
                    "one large copy (GiB/s)",
                ),
                per_device,
            ),
        ]
    )


def link_section(workdir: Path) -> str:
    """Per device: LRU's compute per token and time per copy at 1x and under each slower
    link at the largest multiplier, with their ratios to 1x (moecache link-check)."""
    found = sorted((workdir / "results/link").glob("*.json"))
    if not found:
        return "No link check in this run (no run of the config has a multiplier above 1)."
    rows = []
    for path in found:
        r = read_dict(path, LinkCheckResult)
        device = f"{path.stem} ({r.get('device_name', 'n/a')})"
        for row in r["runs"]:
            low, high = row["compute_ms_ci"]
            rows.append(
                (
                    device,
                    row["link"] or "n/a",
                    f"{row['multiplier']}x",
                    f"{sig(row['compute_ms'])} ({sig(low)}-{sig(high)})",
                    fixed(row["compute_ratio_to_1x"], 2),
                    sig(row["tau_ms"]),
                    fixed(row["tau_ratio_to_1x"], 1),
                )
            )
    r = read_dict(found[0], LinkCheckResult)
    return (
        f"LRU at C = {r['capacity']}, {count(r['timed_tokens'])} timed tokens "
        f"({r['sequences']} sequence(s)), every run interleaved, sequence by sequence in a "
        "shuffled order.\n\n"
        + table(
            (
                "device",
                "slower link",
                "multiplier",
                "compute (ms per token, 95% interval)",
                "compute / 1x",
                "tau (ms per copy)",
                "tau / 1x",
            ),
            rows,
        )
    )


def gpu_check_section(workdir: Path, files: Sequence[Path] = ()) -> str:
    """Per `make gpu-check` results file given (the devices config key report.devices
    names, as Table 1 reads them): the gates in each dtype, the pooled/own ratio with its
    interval, the device memory held against torch's allocation, copy time per multiplier,
    the paper-sized layer."""
    if not files:
        return (
            "No GPU check results (config key report.devices names none; `make gpu-check` "
            "writes measured/gpu-check/<host>.json on a CUDA machine)."
        )
    parts = []
    for path in files:
        r = read(path, "a GPU check")
        versions = r.get("versions", {})
        shown = path.relative_to(workdir) if path.is_relative_to(workdir) else path
        rows = [
            ("device", r["device_name"]),
            ("file", f"`{shown}`"),
            ("torch, transformers", f"{versions.get('torch')}, {versions.get('transformers')}"),
            ("seconds for the whole check", fixed(r["seconds"], 0)),
        ]
        for dtype, g in r["gates"].items():
            rows += gate_rows(dtype, g)
        rows += memory_rows(r["memory"]) + copy_rows(r)
        parts.append(table(("measure", "value"), rows))
    return "\n\n".join(parts)


def gate_rows(dtype: str, g: dict) -> list[tuple[str, str]]:
    """One dtype's gates in a GPU check: NLLs, the pooled/own ratio, the failures."""
    if "error" in g:
        return [(f"gates {dtype}", f"raised {g['error']}")]
    low, high = g["throughput_ratio_ci"]
    failed = "; ".join(g["failures"]).replace("|", "\\|") or "none"
    return [
        (
            f"{dtype}: base NLL, batched NLL",
            f"{g['base']['nll']:.5f}, {g['batched_nll']:.5f}",
        ),
        (
            f"{dtype}: lossless runs' NLL - base NLL (largest)",
            small(max(abs(x["nll"] - g["base"]["nll"]) for x in g["runs"].values())),
        ),
        (
            f"{dtype}: pooled / own block tokens/s",
            f"{fixed(g['throughput_ratio_pool_vs_own_block'], 3)} (95% "
            f"{fixed(low, 3)}-{fixed(high, 3)})",
        ),
        (f"{dtype}: gate failures", failed),
    ]


def memory_rows(memory: dict) -> list[tuple[str, str]]:
    """The device bytes each dtype's pool held against torch's allocation."""
    return [
        (
            f"{dtype}: device bytes held pooled (weights + slots), allocated, allocated - expected",
            f"{count(m['held_bytes'])}, {count(m.get('allocated_pooled_bytes'))}, "
            f"{count(m.get('allocated_pooled_excess_bytes'))}",
        )
        for dtype, m in memory.items()
        if "error" not in m
    ]


def copy_rows(r: dict) -> list[tuple[str, str]]:
    """Copy time per multiplier, for the smoke experts and the paper-sized layer."""
    rows = []
    for what, b in (("smoke experts", r["bandwidth"]), ("paper layer", r["paper_layer"])):
        if b and "multipliers" in b:
            taus = ", ".join(
                f"{m}x {sig(row['tau_ms'])} ms ({fixed(row['ratio_to_1x'], 1)}x)"
                for m, row in b["multipliers"].items()
            )
            rows.append(
                (
                    f"{what}: {count(b['expert_bytes'])} bytes an expert",
                    f"tau {taus}; per-expert loop {sig(b['loop_gib_per_s'])} GiB/s, one "
                    f"large copy {sig(b['large_gib_per_s'])} GiB/s",
                )
            )
    return rows


def runs_section(workdir: Path, shard: str, files: Sequence[Path] | None = None) -> str:
    """Every run at 1x on the first shard: speed with its interval, copies, quality."""
    files = files or list((workdir / f"results/runs/{shard}").glob(at_multiplier(1)))
    reports = sorted((read_run_dict(path) for path in files), key=lambda r: r["run"])
    if not reports:
        raise MoecacheError(f"{workdir / 'results/runs' / shard}: no runs at 1x")
    rows = []
    for r in reports:
        t = r["totals"]
        low, high = t["tokens_per_second_ci"]
        rows.append(
            (
                r["run"],
                r["policy"],
                fixed(t["tokens_per_second"], 1),
                f"{fixed(low, 1)}-{fixed(high, 1)}",
                fixed(t["copies_per_token"], 2),
                fixed(t["rho"], 2),
                sig(t.get("tau_ms")),
                sig(t["compute_ms"]),
                sig(100 * t["copy_share"]),
                sig(t["delta_nll"], 2),
            )
        )
    text = table(
        (
            f"run (shard {shard}, 1x)",
            "policy",
            "tokens/s",
            "95% interval",
            "copies/token",
            "rho",
            "tau (ms)",
            "compute (ms/token)",
            "copy share (%)",
            "Delta NLL",
        ),
        rows,
    )
    lru = next((r for r in reports if r["run"] == "lru"), None) or next(
        (r for r in reports if r["policy"] == "lru"), None
    )
    resident = next((r for r in reports if r["policy"] == AllResident.name), None)
    if lru is not None:
        text += (
            f"\n\nLRU's copies take {sig(100 * lru['totals']['copy_share'])}% of its step at 1x "
            "(copy time over step time)."
        )
        # Under harness.fan_out run, LRU's own job decoded the all-resident run beside it.
        paired = (lru.get("reference") or {}).get("totals")
        reference = paired or (resident["totals"] if resident else None)
        if reference is not None:
            speeds = lru["totals"]["tokens_per_second"], reference["tokens_per_second"]
            slower = 1 - speeds[0] / speeds[1]
            text += (
                f" LRU decodes {sig(100 * slower)}% fewer tokens/s than the all-resident pool, "
                "its copies and its own bookkeeping together (the measure of the paper's L40S, "
                "38.3 against 49.0 tokens/s: 22%)."
            )
    return text


def cost_model_section(workdir: Path) -> str:
    """Table 1's cost-model part as written (any columns), and its verdicts, decided from
    those rows (the winner per multiplier, every run within 5%)."""
    import pandas as pd

    from moecache.report.tables.table1 import cost_model_verdicts

    path = workdir / "figures/table1_cost_model.csv"
    try:
        frame = pd.read_csv(path)
    except FileNotFoundError:
        raise MoecacheError(f"{path}: missing (run the pipeline first)") from None
    except (OSError, ValueError, pd.errors.ParserError) as error:
        raise MoecacheError(f"{path}: not a CSV table ({error})") from None
    if frame.empty:
        return "(no rows: no run was repeated at a copy multiplier above 1)"
    text = table(
        list(frame.columns), [[cell(v) for v in row] for row in frame.itertuples(index=False)]
    )
    verdicts = cost_model_verdicts(frame.to_dict("records"))
    if verdicts:
        text += "\n\n" + "\n".join(f"- {line}" for line in verdicts)
    return text
