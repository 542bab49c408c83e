"""The paper's tables, every cell computed from the pipeline's results files.

Each table is written as CSV (one file per part, full precision), as Markdown with its
caption, and as `<name>.sources.json` (the input files with their SHA-256, the config
hashes and devices they record, the package versions). A table whose inputs this pipeline
does not produce yet says so in its caption and has no rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from moecache import provenance
from moecache.atomic import atomic_file, write_json, write_text
from moecache.atomic import read_json as read
from moecache.errors import MoecacheError
from moecache.report import cost_model, replayed


@dataclass
class Table:
    name: str
    title: str
    caption: str
    parts: dict[str, pd.DataFrame] = field(default_factory=dict)  # "" is the main part
    sources: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # lines after the tables
    part_captions: dict[str, str] = field(default_factory=dict)  # a part's own caption


def policies_frame(runs) -> pd.DataFrame:
    rows = []
    for path in runs:
        p = cost_model.point(read(path), path=path)
        rows.append(
            {
                "run": p.run,
                "policy": p.policy,
                "routing": "restricted" if p.restricts else "preserved",
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
        "tau_ms": cost_model.tau_1x(bandwidth),
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
        r = read(path)
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


def scaled_points(scaled) -> list[cost_model.MeasuredRun]:
    """The runs repeated at copy multipliers > 1, as measured."""
    return [cost_model.point(read(path), path=path) for path in scaled]


def cost_model_part(runs, scaled, bandwidth):
    """Equation (1) with every timed copy against the runs repeated at each multiplier:
    the rows of Table 1's cost-model part, the winner checks and the lines saying them."""
    own = read(bandwidth[0])
    tau1 = cost_model.tau_1x(own)
    points = [cost_model.point(read(path), tau1, path) for path in runs]
    measured = scaled_points(scaled)
    taus = {m: cost_model.tau_at(own, m, bandwidth[0]) for m in {s.multiplier for s in measured}}
    rows, orphans = cost_model.cost_rows(points, measured, taus)
    checks = cost_model.winner_check(rows)
    by_m = {c["multiplier"]: c for c in checks}
    for row in rows:
        c = by_m[row["multiplier"]]
        row["in_winner_check"] = row["run"] in c["runs"]
        row["predicted_winner"] = row["run"] == c.get("predicted_winner")
        row["measured_winner"] = row["run"] == c.get("measured_winner")
    lines = cost_model.winner_lines(checks, rows)
    if orphans:
        lines.append(f"Left out, no 1x run to take n and c from: {', '.join(orphans)}.")
    return tau1, rows, checks, lines


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
    tau1, rows, _, lines = cost_model_part(runs, scaled, bandwidth)
    devices = devices_frame(bandwidth, gpu_check, lines)
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
        f"{tau1:.4g} ms on this machine, so c holds the per-group overhead and the "
        "prediction at 1x is the measured step) and tau(m) this machine's measured copy "
        "time at m; against the measured ms per token of each run repeated at m, with its "
        "95% interval, the relative error (predicted / measured - 1) and whether it is "
        "within 5%.",
        {
            "policies": policies_frame(runs),
            "devices": devices,
            "cost_model": pd.DataFrame(rows, columns=COST_COLUMNS),
        },
        [*runs, *scaled, *bandwidth, *gpu_check],
        lines,
    )


def not_produced(name: str, title: str, what: str, columns: list[str]) -> Table:
    return Table(
        name,
        title,
        f"Not produced yet: {what}. No numbers are printed until the pipeline makes them.",
        {"": pd.DataFrame(columns=columns)},
    )


TABLE2_COLUMNS = [
    "task",
    "row",
    "threshold",
    "accuracy",
    "accuracy_lo",
    "accuracy_hi",
    "retention",
    "retention_lo",
    "retention_hi",
    "retention_se",
    "switch_rate",
    "copies_per_token",
]
TABLE2_ROWS = {
    "free": "Free routing",
    "oracle-set": "Fixed set, oracle selection",
    "recent-use": "Fixed set, chosen from recent use",
}


def table2(accuracy=()) -> Table:
    """Per task, every row's accuracy and retention against free routing (95% intervals
    over the questions), the controller seeds' mean with one standard error, the measured
    switch rate and copies per token; per-question outputs beside each summary."""
    title = "Table 2. Multiple-choice accuracy at a matched switch rate"
    if not accuracy:
        return not_produced(
            "table2", title, "needs the accuracy stage (config section accuracy)", TABLE2_COLUMNS
        )
    rows, notes = [], []
    for path in accuracy:
        report = read(path)
        task = report["task"].removeprefix("moecache_")
        seeds = {}
        for row in report["rows"]:
            name = row["row"]
            label = TABLE2_ROWS.get(name)
            if label is None:  # controller-s{seed}-{matched|tNN}
                seed, point = name.removeprefix("controller-s").split("-", 1)
                label = f"Learned, seed {seed} ({point})"
                seeds.setdefault(point, []).append(row)
            rows.append(
                {
                    "task": task,
                    "row": label,
                    "threshold": row["params"].get("threshold"),
                    "accuracy": row["accuracy"],
                    "accuracy_lo": row["accuracy_ci"][0],
                    "accuracy_hi": row["accuracy_ci"][1],
                    "retention": row["retention"],
                    "retention_lo": row["retention_ci"][0],
                    "retention_hi": row["retention_ci"][1],
                    "retention_se": None,
                    "switch_rate": row["switch_rate"],
                    "copies_per_token": row["copies_per_token"],
                }
            )
        for point, group in seeds.items():
            if len(group) < 2:
                continue
            retention = np.array([r["retention"] for r in group], dtype=float)  # None: nan
            se = float(retention.std(ddof=1) / np.sqrt(len(group)))
            rows.append(
                {
                    "task": task,
                    "row": f"Learned, mean of {len(group)} seeds ({point})",
                    "accuracy": float(np.mean([r["accuracy"] for r in group])),
                    "retention": float(retention.mean()),
                    "retention_se": se,
                    "switch_rate": float(np.mean([r["switch_rate"] for r in group])),
                    "copies_per_token": float(np.mean([r["copies_per_token"] for r in group])),
                }
            )
        free = next(r for r in report["rows"] if r["row"] == "free")
        matched = ", ".join(f"seed {s}: {t:g}" for s, t in report["matched_thresholds"].items())
        notes.append(
            f"{task}: {report['questions']} questions, chance {report['chance']:.3f}; free "
            f"routing {free['accuracy']:.3f} ({free['accuracy_ci'][0]:.3f}-"
            f"{free['accuracy_ci'][1]:.3f}); fixed sets every {report['switch_every']} tokens; "
            f"matched thresholds (held-out refreshes per token nearest "
            f"1/{report['switch_every']}): {matched}."
        )
    return Table(
        "table2",
        title,
        "Scored by lm-eval (log-likelihood of each choice) on the pooled model, one policy "
        "per row over the restricted layers; the blocks restart at each question (the "
        "controller keeps its cached set, as across sequences). Retention is accuracy over "
        "free routing's on the same questions; lo, hi: 95% bootstrap intervals over the "
        "questions; retention_se: one standard error across the controller's seeds. "
        "switch_rate: refreshes per token and restricted layer, as measured on the task "
        "(Dwell's warm start refreshes every token until its window fills); "
        "copies_per_token over all restricted layers.",
        {"": pd.DataFrame(rows, columns=TABLE2_COLUMNS)},
        sources=list(accuracy),
        notes=notes,
    )


ROUTER_OBJECTIVES = {
    "base": "Base (untuned)",
    "sft": "SFT control",
    "hit": "Cache-hit reward",
    "tag": "+ cache-size tag",
    "harness": "Harness-copies reward (all layers, teacher-forced)",
}


def table3(router=()) -> Table:
    """Steady copies per model (moecache router-measure results), on held-out text and on
    each model's own continuations; the simulated hit rate training logged beside the
    harness's; whether either explanation of the null result closes the gap."""
    columns = ["objective", "base_nll", "lru", "lru_lfu_eviction", "trained_layer"]
    if not router:
        return not_produced(
            "table3",
            "Table 3. Steady transfers of routers fine-tuned for cache hits",
            "needs the router fine-tuning runs (config section router_tuning)",
            columns,
        )
    found = {read(path)["model"]: read(path) for path in router}
    models = [name for name in ROUTER_OBJECTIVES if name in found]
    if "base" not in found:
        raise MoecacheError("table3: no measurement of the untuned base among --router")
    tuning = found["base"]["settings"]["router_tuning"]
    layer, capacity = tuning["layer"], tuning["capacity"]

    def copies(text, nll):
        return pd.DataFrame(
            [
                {
                    "objective": ROUTER_OBJECTIVES[name],
                    nll: r[text]["nll"] if r["nll_comparable"] else None,
                    "lru": r[text]["lru_steady"],
                    "lru_lfu_eviction": r[text]["decayed_frequency_steady"],
                    "trained_layer": r[text]["trained_layer_steady"],
                }
                for name, r in ((n, found[n]) for n in models)
            ],
            columns=[nll if c == "base_nll" else c for c in columns],
        )

    base = found["base"]
    rows = []
    for name in models:
        r, training = found[name], found[name]["training"] or {}
        logged = training.get("log_sim_hit_rate") or {}
        rows.append(
            {
                "objective": ROUTER_OBJECTIVES[name],
                "steps": training.get("steps"),
                "logged_sim_hit_rate_start": logged.get("start"),
                "logged_sim_hit_rate_end": logged.get("end"),
                "greedy_sim_hit_rate_start": (training.get("greedy_sim_hit_rate") or {}).get(
                    "start"
                ),
                "greedy_sim_hit_rate_end": (training.get("greedy_sim_hit_rate") or {}).get("end"),
                "harness_hit_rate_heldout": r["teacher_forced"]["trained_layer_hit_rate"],
                "harness_hit_rate_own": r["own_generations"]["trained_layer_hit_rate"],
                "sim_hit_rate_own": r["own_generations"]["sim_hit_rate"],
            }
        )
    tag_nll = found["tag"]["teacher_forced"]["nll"] if "tag" in found else None
    notes = [
        f"Trained layer: layer {layer} alone at C={capacity}, the LRU run's routing at that "
        "layer replayed through the same LRU. "
        + (
            f"The tagged variant's NLL ({tag_nll:.4f}) is not comparable: its tag tokens are "
            "scored too."
            if tag_nll is not None
            else ""
        ),
        "",
        *verdicts(found, base),
    ]
    return Table(
        "table3",
        "Table 3. Steady transfers of routers fine-tuned for cache hits",
        "Steady expert copies (lower is better) on the first "
        f"{base['teacher_forced']['sequences']} held-out sequences of the first shard, "
        "teacher-forced: under lossless LRU, under lossless decayed-frequency (LFU) "
        "eviction, and at the training setting. NLL: the model's own next-token NLL "
        "(lossless serving keeps it).",
        {
            "": copies("teacher_forced", "base_nll"),
            "own_generations": copies("own_generations", "own_text_nll"),
            "simulated_vs_measured": pd.DataFrame(rows),
        },
        list(router),
        notes,
        {
            "own_generations": (
                f"The same counts on each model's own greedy continuations of the first "
                f"{base['own_generations']['sequences']} sequences' starts (explanation one: "
                "the reward sees the model's own generations). NLL there is the model's NLL "
                "on its own text."
            ),
            "simulated_vs_measured": (
                f"Hit rate of a {capacity}-slot LRU at layer {layer}: the training log's "
                "(mean of the first and last quarter of the steps, sampled generations), the "
                "same simulator on greedy continuations of training prompts before and after "
                "training, and the harness's on held-out text and on the model's own "
                "continuations (sim_hit_rate_own: the reward's definition, continuation "
                "tokens only)."
            ),
        },
    )


def verdicts(found: dict, base: dict) -> list[str]:
    """Whether a measured gain reaches half the simulated gain: on own generations (for the
    simulator's variants) and on held-out text (for the harness-copies variant). Gains are
    counted beyond the SFT control's when it was measured: fine-tuning alone also changes
    what a model generates (and how often it repeats itself)."""
    reference = found.get("sft", base)
    against = "the SFT control" if "sft" in found else "the base"

    def change(r, text, key, relative=False):
        mine, theirs, untuned = (m[text][key] for m in (r, reference, base))
        if relative:
            return mine / untuned - 1, theirs / untuned - 1
        return mine - untuned, theirs - untuned

    lines = []
    for name in ("hit", "tag", "harness"):
        if name not in found or not (found[name]["training"] or {}).get("log_reward"):
            continue
        r, training = found[name], found[name]["training"]
        logged = training["log_sim_hit_rate"]
        simulated = logged["end"] - logged["start"]
        held, _ = change(r, "teacher_forced", "trained_layer_hit_rate")
        own, own_ref = change(r, "own_generations", "trained_layer_hit_rate")
        lru, lru_ref = change(r, "teacher_forced", "lru_steady", relative=True)
        label = ROUTER_OBJECTIVES[name].removeprefix("+ ").capitalize()  # no Markdown bullet
        line = (
            f"{label}: logged simulated hit rate {simulated:+.3f}; harness "
            f"hit rate at the trained layer against the base {held:+.3f} on held-out text, "
            f"{own:+.3f} on its own generations ({against}: {own_ref:+.3f}); LRU copies "
            f"{lru:+.1%} against the base ({against}: {lru_ref:+.1%})."
        )
        if name == "harness":
            reward = training["log_reward"]
            # The reward is minus the copies per token: their relative change in the log.
            logged_copies = reward["end"] / reward["start"] - 1 if reward["start"] else 0.0
            line += f" Its logged copies per token (its reward) changed {logged_copies:+.1%}; "
            if logged_copies >= 0:
                line += "the log shows no fall, so there is no gap to close."
            else:
                closes = lru - lru_ref <= logged_copies / 2
                line += (
                    f"the measured change beyond {against} reaches half of that: "
                    f"{'yes' if closes else 'no'}."
                )
        elif simulated <= 0:
            line += " The log shows no simulated gain, so there is no gap to close."
        else:
            closes = own - own_ref >= simulated / 2
            line += (
                f" Measured on its own generations, its gain beyond {against} reaches half "
                f"the simulated gain: {'yes' if closes else 'no'}."
            )
        lines.append(line)
    return lines


def table_controller(sweep=(), longer=(), controller=()) -> Table:
    from moecache.report import controller as ctl

    parts = ["", "seeds", "priced", "longer"]
    if not sweep:
        table = not_produced(
            "table_controller",
            "Appendix. The learned controller",
            "needs the config's controller section (the heads, the threshold sweep)",
            ctl.COLUMNS,
        )
        table.parts = {part: pd.DataFrame(columns=ctl.COLUMNS) for part in parts}
        return table
    rows = ctl.sweep_rows(sweep)
    seeds = ctl.seeds_frame(rows)
    reference = rows[(rows["objective"] == "") & (rows["multiplier"] == 1)]
    longer_rows, longer_lines = ctl.longer_frame(longer)
    notes = [
        "The controller keeps its cached set across sequences; Dwell and Static restart at "
        "each sequence (a sequence's first token fills the pool for every policy, untimed).",
        *ctl.training_lines(controller),
        "",
        "Comparisons on the same sequences:",
        *ctl.matched(seeds, reference),
    ]
    if longer_lines:
        notes += ["", "Longer sequences (the paper's open question):", *longer_lines]
    return Table(
        "table_controller",
        "Appendix. The learned controller: thresholds, objectives, seeds and prices",
        "Every heads file at every threshold, decoded in the harness (interleaved per "
        "threshold) on the first controller.sweep_sequences held-out sequences of the first "
        "shard, with the simple restricting runs (objective blank) on the same sequences. "
        "Delta NLL against the unmodified model; tokens/s with its 95% interval; copies per "
        "timed token; mean timed tokens between refreshes (per layer); the heads' share of "
        "the measured step (percent). seeds: mean and standard error (_se) over seeds per "
        "objective and threshold. priced: the first objective and seed retrained with the "
        "traffic penalty set to e * tau (price e, nats per ms of copy time). longer: "
        "held-out text decoded in sequences of the standard length and in whole sequences "
        "several times longer.",
        {
            "": rows,
            "seeds": seeds,
            "priced": rows[rows["price"].notna()],
            "longer": longer_rows,
        },
        [
            *sweep_files(sweep),
            *longer_files(longer),
            *(Path(p).with_suffix(".json") for p in controller),  # each heads file's log
        ],
        notes,
    )


def sweep_files(sweep) -> list[Path]:
    return [path for folder in sweep for path in sorted(Path(folder).glob("*.json"))]


def longer_files(longer) -> list[Path]:
    return [Path(folder) / "summary.json" for folder in longer]


def table_eviction(replay, learned) -> Table:
    rows = []
    for path in replay:
        r = read(path)
        for rule, result in r["rules"].items():
            t = result["totals"]
            rows.append(
                {
                    "trace": replayed.shard_of(path),
                    "capacity": r["capacity"],
                    "experts": r["experts"],
                    "rule": rule,
                    "after_fill": t["after_fill"],
                    "steady": t["steady"],
                    "copies_per_token": t["copies_per_token"],
                    "gap_recovered": t["gap_recovered"],
                }
            )
    parts = {"": pd.DataFrame(rows)}
    captions = {}
    if learned:
        parts["learned_scorers"] = learned_frame(read(learned[0]))
        captions["learned_scorers"] = (
            "Scorers trained to imitate farthest-future (learned.*), replayed on each shard's "
            "trace and, where named in learned.closed_loop, decoding in the harness: share of "
            "the LRU-to-oracle gap on the shard's held-out sequences and on all of them, the "
            "tokens of foresight the held-out share is worth (foresight curve; blank below "
            "k = 1), and the validation loss that selected each scorer. past-use-<shard> "
            "scorers fit on that shard's first sequences; router and trace-past-use on the "
            "training trace. mlp-permuted: the MLP on permuted labels (the control)."
        )
    return Table(
        "table_eviction",
        "Appendix. Eviction rules replayed on the recorded demand",
        "Each lossless rule (the paper's causal rules, the caching literature's zoo and the "
        "oracle) replayed on the trace run's demand, per shard and pool capacity C (the "
        "harness's, and each of replay.capacities, such as the paper's C = N/2): steady "
        "transfers "
        "(after_fill, insertions beyond the first C of each stream; steady, the harness's "
        "split), steady copies per token, and the share of the gap between LRU and "
        "farthest-future (full lookahead) each rule recovers.",
        parts,
        [*replay, *learned],
        part_captions=captions,
    )


def learned_frame(evaluation: dict) -> pd.DataFrame:
    rows = []
    for shard, result in evaluation["shards"].items():
        heldout, everything = result["replay"]["heldout"], result["replay"]["all"]
        for name in heldout:
            if name in ("lru", "oracle"):
                continue
            trained = evaluation["training"].get(name, {})
            loop = result["closed_loop"].get(name)
            rows.append(
                {
                    "trace": shard,
                    "rule": name,
                    "features": trained.get("feature_set", "hand-built"),
                    "gap_heldout": heldout[name]["gap_recovered"],
                    "gap_all": everything[name]["gap_recovered"],
                    "foresight_k": heldout[name]["foresight_equivalent"],
                    "closed_loop_heldout": loop["heldout"]["gap_recovered"] if loop else None,
                    "closed_loop_all": loop["all"]["gap_recovered"] if loop else None,
                    "closed_equals_replay": loop["matches_replay"] if loop else None,
                    "validation_loss": trained.get("validation_loss"),
                }
            )
    return pd.DataFrame(rows)


def table_bounds(bound, sweep) -> Table:
    rows, mixed_rows, not_optimal = [], [], []
    for path in bound:
        report = read(path)
        t, trace = report["totals"], replayed.shard_of(path)
        rows.append(
            {
                "trace": trace,
                "capacity": report["capacity"],
                "b_flat": t["b_flat"],
                "b_star": t["b_star"],
                "b_greedy": t["b_greedy"],
                "greedy_minus_b_star": t["greedy_minus_b_star"],
                "greedy_optimal_share": t["greedy_optimal_share"],
                "gap": t["gap"],
                "coincide_share": t["coincide_share"],
                "median_stream_gap": t["median_stream_gap"],
                "streams": t["streams"],
                "integral": t["integral"],
                "lp_seconds": t["lp_seconds"],
            }
        )
        not_optimal += [
            f"{trace} C={report['capacity']} {s['stream']}"
            for s in report["streams"]
            if not s["greedy_optimal"]
        ]
        mixed = report.get("mixed_precision")
        if mixed:
            m = mixed["totals"]
            mixed_rows.append(
                {
                    "trace": trace,
                    "capacity": report["capacity"],
                    "share": mixed["share"],
                    "cost": mixed["cost"],
                    "lp": m["lp"],
                    "farthest_future": m["farthest_future"],
                    "farthest_future_gap": m["farthest_future_gap"],
                    "farthest_future_optimal_share": m["farthest_future_optimal_share"],
                    "cheapest": m["cheapest"],
                    "cheapest_gap": m["cheapest_gap"],
                    "integral": m["integral"],
                }
            )
    sweep_rows = [
        {
            "instances": s["instances"],
            "k_over_c": " ".join(map(str, s["k_over_c"])),
            "greedy_not_optimal": s["greedy_not_optimal"],
            "greedy_above_lru": s["greedy_above_lru"],
            "lp_dp_disagreements": s["lp_dp_disagreements"],
        }
        for s in map(read, sweep)
    ]
    if not bound:
        verdict = "No shard was bounded."
    elif not_optimal:
        verdict = (
            f"At unit cost, greedy farthest-future is above B* on {len(not_optimal)} streams: "
            f"{', '.join(not_optimal[:10])}{' ...' if len(not_optimal) > 10 else ''}."
        )
    else:
        verdict = "At unit cost, greedy farthest-future equals B* on every stream of every shard."
    return Table(
        "table_bounds",
        "Appendix. Farthest-future eviction against the fewest copies possible",
        "Per shard and pool capacity C: the lower bound B_flat (classical MIN on the "
        "flattened stream, the "
        "tightest of the within-token orders tried), the exact optimum B* (the fewest copies "
        "of any lossless schedule, prefetching allowed: a linear program whose solution is "
        "checked integral, docs/optimum.md), greedy farthest-future B_greedy, greedy's "
        "distance to B* (copies, and the share of (layer, sequence) streams where greedy "
        "is optimal), the relative gap between B_greedy and B_flat, the share of streams "
        "where they coincide, the median gap per stream and the LP's seconds for the shard. "
        "Sweep: greedy against the exact optimum (the LP, cross-checked against the "
        "dynamic program on every instance) on random instances; every instance where "
        "greedy is not optimal is listed in the sweep's results file.",
        {
            "": pd.DataFrame(rows),
            "sweep": pd.DataFrame(sweep_rows),
            "mixed_precision": pd.DataFrame(mixed_rows),
        },
        [*bound, *sweep],
        [verdict],
        {
            "mixed_precision": "Where the optimum stops being greedy: the same recorded demand "
            "with non-unit copy costs, a seeded random `share` of each layer's experts kept at "
            "lower precision and costing `cost` per copy (the others 1). Reload cost (the "
            "total minus each requested expert's first load, which every schedule pays) of "
            "the least-cost schedule (the LP), of farthest-future and of the cost-aware "
            "greedy that evicts the cheapest expert to reload; their relative gaps to the "
            "LP, and the share of streams where farthest-future is still optimal. When "
            "copies cost different amounts, the farthest-future oracle is not the optimum."
        },
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


# Name -> (builder, the input flags it reads: its parameters); `moecache table` refuses others.
BUILDERS = {
    "table1": (table1, ("runs", "scaled", "bandwidth", "gpu_check")),
    "table2": (table2, ("accuracy",)),
    "table3": (table3, ("router",)),
    "table_controller": (table_controller, ("sweep", "longer", "controller")),
    "table_eviction": (table_eviction, ("replay", "learned")),
    "table_bounds": (table_bounds, ("bound", "sweep")),
    "table_replication": (table_replication, ("runs", "replication")),
}


def write(table: Table, out_dir) -> None:
    out_dir = Path(out_dir)
    source = provenance.sources(table.sources)
    lines = [f"### {table.title}", "", table.caption, ""]
    for part, frame in table.parts.items():
        stem = f"{table.name}_{part}" if part else table.name
        with atomic_file(out_dir / f"{stem}.csv") as tmp:
            frame.to_csv(tmp, index=False)
        if part:
            lines += [f"**{part.replace('_', ' ')}**", ""]
        if part in table.part_captions:
            lines += [table.part_captions[part], ""]
        if len(frame):
            lines += [frame.to_markdown(index=False, floatfmt=".4g"), ""]
        else:
            lines += ["(no rows)", ""]
    lines += table.notes + ([""] if table.notes else [])
    lines.append(
        f"Config hash {', '.join(source['config_hashes']) or 'n/a'}; device "
        f"{', '.join(source['devices']) or 'n/a'}; moecache {source['versions']['moecache']}; "
        f"sources in `{table.name}.sources.json`."
    )
    write_text(out_dir / f"{table.name}.md", "\n".join(lines) + "\n")
    write_json(out_dir / f"{table.name}.sources.json", source)
