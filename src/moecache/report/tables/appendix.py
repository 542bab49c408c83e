"""The appendix tables: the learned controller, eviction rules replayed on the recorded
demand (with the learned scorers), and farthest-future against the fewest copies possible."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from moecache.records.io import read_dict, read_replay_dict
from moecache.records.learned import LearnedEvaluation
from moecache.records.replay import BoundResult, OptimumSweep
from moecache.report import causal, replayed
from moecache.report.tables.base import Table, not_produced


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
    ]
    verdicts = {"Comparisons on the same sequences:": ctl.matched(seeds, reference)}
    if longer_lines:
        verdicts["Longer sequences (the paper's open question):"] = longer_lines
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
        verdicts=verdicts,
    )


def sweep_files(sweep) -> list[Path]:
    return [path for folder in sweep for path in sorted(Path(folder).glob("*.json"))]


def longer_files(longer) -> list[Path]:
    return [Path(folder) / "summary.json" for folder in longer]


def table_eviction(replay, learned) -> Table:
    rows = []
    for path in replay:
        r = read_replay_dict(path)
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
    checks = [p for p in learned if causal.is_check(p)]
    studies = [p for p in learned if causal.is_study(p)]
    learned = [p for p in learned if not causal.is_study(p) and p not in checks] + studies
    if learned and not causal.is_study(learned[0]):
        parts["learned_scorers"] = learned_frame(read_dict(learned[0], LearnedEvaluation))
        captions["learned_scorers"] = (
            "Scorers trained to imitate farthest-future (learned.*), replayed on each shard's "
            "trace and, where named in learned.closed_loop, decoding in the harness: share of "
            "the LRU-to-oracle gap on the shard's held-out sequences and on all of them, the "
            "tokens of foresight the held-out share is worth (foresight curve; blank below "
            "k = 1), and the validation loss that selected each scorer. past-use-<shard> "
            "scorers fit on that shard's first sequences; router and trace-past-use on the "
            "training trace. mlp-permuted: the MLP on permuted labels (the control)."
        )
    if studies:
        parts["causal_rules"] = causal.frame(causal.read(studies[0]))
        captions["causal_rules"] = causal.CAPTION
    if checks:
        check = causal.read_check(checks[0])
        parts["causal_check"] = causal.check_frame(check)
        captions["causal_check"] = causal.check_caption(check)
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
        [*replay, *learned, *checks],
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
    reports = [(read_dict(path, BoundResult), replayed.shard_of(path)) for path in bound]
    sweep_rows = [
        {
            "instances": s["instances"],
            "k_over_c": " ".join(map(str, s["k_over_c"])),
            "greedy_not_optimal": s["greedy_not_optimal"],
            "greedy_above_lru": s["greedy_above_lru"],
            "lp_dp_disagreements": s["lp_dp_disagreements"],
        }
        for s in (read_dict(path, OptimumSweep) for path in sweep)
    ]
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
            "": pd.DataFrame([bound_row(report, trace) for report, trace in reports]),
            "sweep": pd.DataFrame(sweep_rows),
            "mixed_precision": pd.DataFrame(
                [mixed_row(r, trace) for r, trace in reports if r.get("mixed_precision")]
            ),
        },
        [*bound, *sweep],
        part_captions={
            "mixed_precision": "Where the optimum stops being greedy: the same recorded demand "
            "with non-unit copy costs, a seeded random `share` of each layer's experts kept at "
            "lower precision and costing `cost` per copy (the others 1). Reload cost (the "
            "total minus each requested expert's first load, which every schedule pays) of "
            "the least-cost schedule (the LP), of farthest-future and of the cost-aware "
            "greedy that evicts the cheapest expert to reload; their relative gaps to the "
            "LP, and the share of streams where farthest-future is still optimal. When "
            "copies cost different amounts, the farthest-future oracle is not the optimum."
        },
        verdicts={"": [greedy_verdict(reports)]},
    )


def bound_row(report: dict, trace: str) -> dict:
    t = report["totals"]
    return {
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


def mixed_row(report: dict, trace: str) -> dict:
    mixed = report["mixed_precision"]
    m = mixed["totals"]
    return {
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


def greedy_verdict(reports: list[tuple[dict, str]]) -> str:
    """Whether greedy farthest-future reaches B* at unit cost, naming the streams where not."""
    if not reports:
        return "No shard was bounded."
    not_optimal = [
        f"{trace} C={report['capacity']} {s['stream']}"
        for report, trace in reports
        for s in report["streams"]
        if not s["greedy_optimal"]
    ]
    if not not_optimal:
        return "At unit cost, greedy farthest-future equals B* on every stream of every shard."
    return (
        f"At unit cost, greedy farthest-future is above B* on {len(not_optimal)} streams: "
        f"{', '.join(not_optimal[:10])}{' ...' if len(not_optimal) > 10 else ''}."
    )
