"""Table 1: quality, speed and copies per policy, copy time per device, and the cost
model's check (equation (1) against the runs repeated at slower copies); the second-shard
replication appendix reads the same per-run rows."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from moecache.atomic import read_json as read
from moecache.costs import equation
from moecache.errors import MoecacheError
from moecache.records.bandwidth import BandwidthResult
from moecache.records.io import read_dict, read_run, read_run_dict
from moecache.report.tables import overlap
from moecache.report.tables.base import Table, not_produced


def policies_frame(runs) -> pd.DataFrame:
    rows = []
    for path in runs:
        report = read_run_dict(path)
        p = equation.point(report, path=path)
        rows.append(
            {
                "run": p.run,
                "policy": p.policy,
                "routing": "restricted" if p.restricts else "preserved",
                # Overlapped runs: their prefetcher (None for blocking runs); their copy
                # share is the stall's.
                "overlap": report.get("prefetch") or "",
                "delta_nll": p.delta_nll,
                "tokens_per_second": p.tokens_per_second,
                "tokens_per_second_lo": p.tokens_per_second_ci[0],
                "tokens_per_second_hi": p.tokens_per_second_ci[1],
                "copies_per_token": p.copies_per_token,
                "rho": p.rho,
                "copy_share_pct": 100 * p.copy_share,
                "compute_ms": p.measured_compute_ms,
                "compute_ms_lo": p.measured_compute_ms_ci[0],
                "compute_ms_hi": p.measured_compute_ms_ci[1],
            }
        )
    return pd.DataFrame(rows)


def device_row(bandwidth: dict, device: str, file: str, source: str) -> dict:
    row = {
        "device": device,
        "source": source,
        "file": file,
        "expert_bytes": bandwidth.get("expert_bytes"),
        "tau_ms": equation.tau_1x(bandwidth),
        "group_overhead_ms": bandwidth.get("group_overhead_ms"),
        "gib_per_s": bandwidth["loop_gib_per_s"],
        "large_copy_gib_per_s": bandwidth.get("large_gib_per_s"),
    }
    multipliers = bandwidth.get("multipliers", {})
    for m in sorted(multipliers, key=float):
        if float(m) != 1:
            row[f"tau_ms_x{m}"] = multipliers[m]["tau_ms"]
            row[f"ratio_x{m}"] = multipliers[m]["ratio_to_1x"]
    return row


def gpu_check_bandwidth(report: dict) -> tuple[str, dict | None]:
    """The bandwidth measurement a GPU check's device row comes from: the one its
    `device_row` names (the paper-sized layer) where measured, else its `bandwidth`."""
    for key in (report.get("device_row"), "bandwidth"):
        if key and isinstance(report.get(key), dict) and "loop_gib_per_s" in report[key]:
            return key, report[key]
    return "bandwidth", None


def devices_frame(bandwidth, gpu_check=(), notes=None) -> pd.DataFrame:
    """One row per device: the bandwidth files (this machine's first), then the GPU checks'
    bandwidth measurements. tau at 1x and at each multiplier, with its ratio to 1x. A GPU
    check that measured no bandwidth is left out (a line in `notes` says so)."""
    rows = []
    for path in bandwidth:
        r = read_dict(path, BandwidthResult)
        rows.append(device_row(r, r["device_name"], Path(path).stem, "bandwidth"))
    for path in gpu_check:
        r = read(path)
        key, measured = gpu_check_bandwidth(r)
        name = r.get("device_name") or (measured or {}).get("device_name")
        if measured is None:
            if notes is not None:
                notes.append(f"GPU check {Path(path).name} ({name}) measured no bandwidth.")
            continue
        source = "gpu-check" if key == "bandwidth" else f"gpu-check ({key.replace('_', ' ')})"
        rows.append(device_row(measured, name, Path(path).stem, source))
    frame = pd.DataFrame(rows)
    # Columns per multiplier, in the multipliers' order.
    fixed = [c for c in frame.columns if not c.startswith(("tau_ms_x", "ratio_x"))]
    scaled = sorted(
        (c for c in frame.columns if c.startswith(("tau_ms_x", "ratio_x"))),
        key=lambda c: (float(c.rsplit("x", 1)[1]), not c.startswith("tau")),
    )
    return frame[fixed + scaled]


def scaled_points(scaled) -> list[equation.MeasuredRun]:
    """The runs repeated at copy multipliers > 1, as measured."""
    return [equation.point(read_run_dict(path), path=path) for path in scaled]


@dataclass(frozen=True)
class CostModelPart:
    """Table 1's cost-model part: its rows, the winner check per multiplier, the runs
    left out (no 1x run to take n and c from)."""

    tau1_ms: float
    rows: list[dict]
    checks: list[dict]
    orphans: list[str]

    def verdicts(self) -> list[str]:
        return equation.winner_lines(self.checks, self.rows)


def cost_model_verdicts(rows: list[dict]) -> list[str]:
    """The cost model's verdicts from its rows as written (figures/table1_cost_model.csv):
    the winner per multiplier and whether every run is within 5%."""
    return equation.winner_lines(equation.winner_check(rows), rows)


def cost_model_part(runs, scaled, bandwidth) -> CostModelPart:
    """Equation (1) with every timed copy against the runs repeated at each multiplier:
    the rows of Table 1's cost-model part and the winner checks."""
    own = read_dict(bandwidth[0], BandwidthResult)
    tau1 = equation.tau_1x(own)
    # Equation (1) prices blocking copies: overlapped runs are Table 1's overlapped part.
    runs, scaled = blocking(runs), blocking(scaled)
    points = [equation.point(read_run_dict(path), tau1, path) for path in runs]
    measured = scaled_points(scaled)
    taus = {m: equation.tau_at(own, m, bandwidth[0]) for m in {s.multiplier for s in measured}}
    rows, orphans = equation.cost_rows(points, measured, taus)
    checks = equation.winner_check(rows)
    by_m = {c["multiplier"]: c for c in checks}
    for row in rows:
        c = by_m[row["multiplier"]]
        row["in_winner_check"] = row["run"] in c["runs"]
        row["predicted_winner"] = row["run"] == c.get("predicted_winner")
        row["measured_winner"] = row["run"] == c.get("measured_winner")
    return CostModelPart(tau1, rows, checks, orphans)


def blocking(paths) -> list:
    return [path for path in paths if read_run(path).blocking]


COST_COLUMNS = [
    "multiplier",
    "run",
    "n",
    "c_ms",
    "tau1_ms",
    "tau_ms",
    "tau_bandwidth_ms",
    "predicted_ms",
    "measured_ms",
    "measured_ms_lo",
    "measured_ms_hi",
    "relative_error",
    "within_5pct",
    "in_winner_check",
    "predicted_winner",
    "measured_winner",
]


def table1(runs, scaled, bandwidth, gpu_check=()) -> Table:
    if not bandwidth:
        raise MoecacheError("table1: give --bandwidth (the first file is this machine's tau)")
    part = cost_model_part(runs, scaled, bandwidth)
    notes = []
    if part.orphans:
        notes.append(f"Left out, no 1x run to take n and c from: {', '.join(part.orphans)}.")
    devices = devices_frame(bandwidth, gpu_check, notes)
    parts = {
        "policies": policies_frame(runs),
        "devices": devices,
        "cost_model": pd.DataFrame(part.rows, columns=COST_COLUMNS),
    }
    overlapped = overlap.overlapped_frame([*runs, *scaled])
    captions = {}
    if len(overlapped):
        parts["overlapped"] = overlapped
        captions["overlapped"] = OVERLAPPED_CAPTION
    return Table(
        "table1",
        "Table 1. Quality, speed and copies per policy; copy time per device",
        "Left (policies): at 1x on the first shard, Delta NLL against the all-resident "
        "base; measured tokens/s with its 95% interval (lo, hi: bootstrap over sequences); "
        "copies per timed token (every copy, fills after a sequence's first token included) "
        "and the steady copies per token rho; the share of the step spent copying (percent); "
        "compute ms per token (the step minus the timed copy time) with its interval. "
        "'preserved' policies never change a routing decision. Right (devices): per device, "
        "time per expert copy tau at 1x and at each copy multiplier m with its ratio to 1x "
        "(the slope through groups of 1, 2, 4 and 8 copies), the fixed overhead of a group "
        "of copies and the bandwidth of the per-expert copy loop; from the bandwidth files "
        "and the GPU checks (their paper-sized layer where measured). Cost model: "
        "equation (1) with every timed copy, c + n tau(m), "
        f"with n the copies per timed token at 1x, c = step ms at 1x - n tau(1) (tau(1) = "
        f"{part.tau1_ms:.4g} ms on this machine, so c holds the per-group overhead and the "
        "prediction at 1x is the measured step) and tau(m) this machine's measured copy "
        "time at m; against the measured ms per token of each run repeated at m, with its "
        "95% interval, the relative error (predicted / measured - 1) and whether it is "
        "within 5%.",
        parts,
        [*runs, *scaled, *bandwidth, *gpu_check],
        notes,
        part_captions=captions,
        verdicts={"": part.verdicts()},
    )


OVERLAPPED_CAPTION = (
    "Runs whose copies overlap compute (`overlap: true`: a copy stream on a GPU, a copy "
    "worker on its own core on a CPU), each beside the blocking run of the same policy at "
    "the same multiplier: ms per token with its 95% interval, the ms per token compute "
    "stalled on copies and the copy time hidden under compute, demand and prefetch copies "
    "per token, and the prefetcher's accuracy (the share of its copies used by the token "
    "they were fetched for) and wasted copies. Equation (1), a model of blocking copies, "
    "is not applied to them."
)


def table_replication(runs, replication) -> Table:
    if not replication:
        return not_produced(
            "table_replication",
            "Appendix. Second-shard replication",
            "the config decodes only one shard",
            ["run", "delta_nll", "rho", "delta_nll_first", "rho_first"],
        )
    first = policies_frame(runs).set_index("run")
    second = policies_frame(replication)
    frame = second[["run", "policy", "routing", "delta_nll", "rho", "tokens_per_second"]].copy()
    frame["delta_nll_first"] = frame["run"].map(first["delta_nll"])
    frame["rho_first"] = frame["run"].map(first["rho"])
    return Table(
        "table_replication",
        "Appendix. Second-shard replication",
        "The same runs on a disjoint held-out shard (1x): Delta NLL, rho and tokens/s, with "
        "the first shard's Delta NLL and rho beside them.",
        {"": frame},
        [*replication, *runs],
    )
