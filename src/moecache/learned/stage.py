"""The learned stage's jobs, one per rule: record the training trace, label a trace with
the oracle's choices, fit one scorer, and evaluate every scorer in replay and closed loop.

The groups of scorers are named in records/scorer_groups.py. Held-out sequences are never fitted
on.
"""

from __future__ import annotations

import numpy as np
import torch

from moecache import config as configs
from moecache import provenance
from moecache.errors import MoecacheError
from moecache.learned import fit
from moecache.policies import scorers
from moecache.records.demand import Demand, subset
from moecache.records.scorer_groups import CONTROL, TRACE_GROUPS, applies, feature_set, group_kinds
from moecache.replay import engine


def record_trace(settings, model_source, tokenizer_source, text_path, out) -> dict:
    """The routing of the first corpus.trace_sequences training documents, in the harness's
    trace format (tokens cut as the held-out shards' are)."""
    from moecache.data import corpus, tokenizer
    from moecache.harness import jobs
    from moecache.learned import trace
    from moecache.records import trace as traces

    harness, wanted = settings["harness"], settings["corpus"]["trace_sequences"]
    docs = corpus.read(text_path)
    if len(docs) < wanted:
        raise MoecacheError(
            f"{text_path}: {len(docs)} training documents; corpus.trace_sequences needs {wanted}"
        )
    rows = corpus.sequences(
        tokenizer.load(tokenizer_source), docs[:wanted], settings["corpus"]["heldout"]["max_tokens"]
    )
    torch.set_num_threads(harness["threads"])
    model = jobs.load_model(settings, model_source, harness["device"])
    sequences = [row["input_ids"] for row in rows]
    recorded = trace.record(model, sequences, harness["restricted_layers"], harness["device"])
    origin = {
        "run": "training-trace",
        "multiplier": 1,
        "settings_hash": provenance.settings_hash(settings),
        "device_name": provenance.device_name(harness["device"]),
    }
    traces.write(recorded, out, origin)
    return {"sequences": len(sequences), "tokens": sum(map(len, sequences))}


def split(demand: Demand, heldout: int, validation: int) -> tuple[list[int], list[int]]:
    """Stream indices fitted on and validated on: of the sequences before the last
    `heldout`, the last `validation` validate and the rest fit."""
    order = list(dict.fromkeys(demand.sequences))
    training = order[: len(order) - heldout]
    fitted, validated = set(training[: len(training) - validation]), set(training[-validation:])
    streams = range(len(demand.streams))
    return (
        [s for s in streams if demand.sequences[s] in fitted],
        [s for s in streams if demand.sequences[s] in validated],
    )


def fit_group(settings, group, demand: Demand, events, out_dir) -> dict:
    """Train every scorer of `group` on one feature table and save each in safetensors
    (`out_dir`/<kind>.safetensors), with its training summary in the file's metadata."""
    from pathlib import Path

    learned = settings["learned"]
    on_trace = group in TRACE_GROUPS
    heldout = 0 if on_trace else settings["replay"]["heldout_sequences"]
    validation = learned["validation_sequences"]["trace" if on_trace else "shard"]
    fitted, validated = split(demand, heldout, validation)
    used = subset(demand, fitted + validated)
    row = {name: i for i, name in enumerate(used.streams)}
    events = events[events["name"].isin(row)].copy()
    events["stream"] = events["name"].map(row)
    features = feature_set(group)
    tables = [
        fit.Table.of(used, list(rows), features)
        for rows in (range(len(fitted)), range(len(fitted), len(used.streams)))
    ]
    summaries = {}
    for kind in group_kinds(learned, group):
        control = kind == CONTROL
        # The control trains once: DAgger would only add more labels drawn at random.
        rounds = 0 if control else learned["dagger_rounds"]
        model, summary = fit.learn(
            kind.removesuffix("-permuted"),
            features,
            used,
            events,
            *tables,
            {**learned, "dagger_rounds": rounds, "capacity": settings["harness"]["capacity"]},
            settings["seed"],
            permute=control,
        )
        summary.update(
            group=group,
            name=kind,
            fit_sequences=len(dict.fromkeys(used.sequences[s] for s in range(len(fitted)))),
            validation_sequences=validation,
            selection="the step with the lowest validation loss (cross-entropy with the "
            "oracle's victims) among checks every learned.check_every steps, last round",
        )
        # The metadata keeps every round's result, not its loss curve.
        kept = [{k: v for k, v in r.items() if k != "curve"} for r in summary["rounds"]]
        scorers.save(model, Path(out_dir) / f"{kind}.safetensors", {**summary, "rounds": kept})
        summaries[kind] = summary
    return summaries


def by_sequence(demand: Demand, insertions: np.ndarray) -> dict[str, int]:
    """Copies per sequence (its layers' streams together), as the harness counts them."""
    out: dict[str, int] = {}
    for sequence, copies in zip(demand.sequences, insertions.tolist(), strict=True):
        out[sequence] = out.get(sequence, 0) + copies
    return out


def replayed(demand: Demand, capacity: int, rules: dict) -> dict[str, dict[str, int]]:
    """Copies per sequence of every rule (label -> rule text or policy), with LRU and the
    oracle (farthest-future) that the gap runs between."""
    rules = {"lru": "lru", "oracle": "farthest-future", **rules}
    return {
        label: by_sequence(
            demand,
            engine.run(
                demand,
                engine.make_rule(rule, demand, capacity) if isinstance(rule, str) else rule,
            ).insertions,
        )
        for label, rule in rules.items()
    }


def shares(copies: dict[str, dict[str, int]], heldout: list[str]) -> dict:
    """Copies and the share of the LRU-to-oracle gap of every rule, on the held-out
    sequences and on all. Every rule fills an empty pool alike, so the share of all copies
    is the share of copies after the fill."""
    out = {}
    for name, chosen in (("heldout", set(heldout)), ("all", set(copies["lru"]))):
        total = {label: sum(c[s] for s in chosen) for label, c in copies.items()}
        out[name] = {
            label: {
                "copies": n,
                "gap_recovered": engine.gap_recovered(total["lru"], total["oracle"], n),
            }
            for label, n in total.items()
        }
    return out


def foresight_equivalent(share: float | None, points: list[dict]) -> float | None:
    """Tokens of foresight a share is worth: interpolated between the curve's points
    (k, share); None below k = 1, the largest k when above all of them."""
    curve = [(p["k"], p["gap_recovered"]) for p in points if p["k"] is not None]
    if share is None or not curve or share < curve[0][1]:
        return None
    for (k0, s0), (k1, s1) in zip(curve, curve[1:], strict=False):
        if share <= s1:
            return float(k0 + (k1 - k0) * (share - s0) / (s1 - s0)) if s1 > s0 else float(k0)
    return float(curve[-1][0])


def scorer_name(path) -> str:
    """group/kind of a scorer file results/learned/scorers/<group>/<kind>.safetensors."""
    from pathlib import Path

    path = Path(path)
    return f"{path.parent.name}/{path.stem}"


def evaluate(
    settings, traces: dict, scorer_files: list, foresight_files: dict, closed_files
) -> dict:
    """Per shard: every scorer, LRU, the oracle and decayed frequency replayed on the
    shard's trace (held-out sequences and all), each scorer's foresight equivalent, and
    the closed-loop runs' copies from the harness beside the replay's."""
    from moecache.records import trace
    from moecache.records.io import read_record
    from moecache.records.replay import ForesightResult

    capacity = settings["harness"]["capacity"]
    last = settings["replay"]["heldout_sequences"]
    arch = settings["model"]["architecture"]
    closed = closed_loop_reports(closed_files)
    shards = {}
    for shard, path in traces.items():
        demand = trace.read_demand(path, arch["num_experts"])
        heldout = list(dict.fromkeys(demand.sequences))[len(set(demand.sequences)) - last :]
        copies = replayed(demand, capacity, shard_rules(demand, capacity, scorer_files, shard))
        curve = read_record(foresight_files[shard], ForesightResult).subsets
        replay = shares(copies, heldout)
        for part, rows in replay.items():
            for row in rows.values():
                row["foresight_equivalent"] = foresight_equivalent(
                    row["gap_recovered"], curve[part]["foresight"]
                )
        shards[shard] = {
            "heldout_sequences": heldout,
            "replay": replay,
            "closed_loop": closed_loop_shares(closed.get(shard, {}), copies, heldout),
        }
    training = {scorer_name(f): scorers.about(f) for f in scorer_files}
    for about in training.values():
        about.pop("curve", None)
    return {"capacity": capacity, "shards": shards, "training": training}


def closed_loop_reports(closed_files) -> dict[str, dict[str, dict]]:
    """The learned scorers' closed-loop runs, per shard and scorer name (group/kind)."""
    from moecache.records.io import read_run_dict

    closed = {}
    for path in closed_files:
        report = read_run_dict(path)
        if report["policy"] != "learned":  # a causal rule's (causal_check.py compares it)
            continue
        closed.setdefault(report["shard"], {})[scorer_name(report["params"]["weights"])] = report
    return closed


def shard_rules(demand: Demand, capacity: int, scorer_files: list, shard: str) -> dict:
    """The rules replayed on `shard` beside LRU and the oracle: decayed frequency and every
    scorer that applies to it."""
    from moecache.policies.learned import Learned

    mine = {scorer_name(f): f for f in scorer_files if applies(scorer_name(f), shard)}
    return {
        "decayed-frequency": "decayed-frequency",
        **{
            name: Learned(
                capacity,
                demand.num_experts,
                demand.top_k,
                str(f),
                feature_set(name.split("/")[0]),
            )
            for name, f in mine.items()
        },
    }


def closed_loop_shares(closed: dict, copies: dict, heldout: list[str]) -> dict:
    """Each closed-loop run's copies as the harness counted them, their share of the
    LRU-to-oracle gap, and whether they match the replay's."""
    loops = {}
    for name, report in closed.items():
        measured = {f"seq{r['sequence']}": r["fills"] + r["steady"] for r in report["sequences"]}
        loop = shares({**copies, name: measured}, heldout)
        loops[name] = {
            "heldout": loop["heldout"][name],
            "all": loop["all"][name],
            "matches_replay": measured == copies[name],
            "delta_nll": report["totals"]["delta_nll"],
            "tokens_per_second": report["totals"]["tokens_per_second"],
            "tokens_per_second_ci": report["totals"]["tokens_per_second_ci"],
        }
    return loops


def closed_loop_runs(names: list[str], shard: str, scorers_dir: str = "results/learned/scorers"):
    """harness.runs entries decoding the scorers `names` (group/kind) that apply to `shard`."""
    return {
        "learned-" + name.replace("/", "-"): configs.run_spec(
            "learned",
            {
                "weights": f"{scorers_dir}/{name}.safetensors",
                "features": feature_set(name.split("/")[0]),
            },
        )
        for name in names
        if applies(name, shard)
    }


CAUSAL = "causal-"  # the label prefix of a causal rule's closed-loop run


def causal_runs(study) -> dict:
    """harness.runs entries decoding every rule the causal study (records/causal.py) tuned,
    and its next-use model, with the parameters it chose (the control is left out)."""
    chosen = {name: tuning["chosen"] for name, tuning in study.tuning.items()}
    chosen["next-use"] = study.next_use["chosen"]
    return {CAUSAL + name: configs.run_spec(name, params) for name, params in chosen.items()}


def causal_loop(settings, shard: str, study) -> tuple[dict, int | None]:
    """The causal rules `shard` decodes closed loop (learned.causal.closed_loop) and on how
    many of its first sequences; no runs where the config names no closed loop there."""
    loop = settings["learned"].get("causal", {}).get("closed_loop")
    if not loop or shard not in loop["shards"]:
        if study is not None:
            raise MoecacheError(
                f"shard {shard}: given the causal study, but learned.causal.closed_loop does "
                "not decode its rules there"
            )
        return {}, None
    if study is None:
        raise MoecacheError(
            f"shard {shard}: learned.causal.closed_loop decodes the causal rules there: give "
            "--causal (the causal study, results/learned/causal.json)"
        )
    return causal_runs(study), loop["sequences"]


def decoding(settings, runs: dict) -> dict:
    """`settings` whose harness decodes `runs` alone (the first of them its trace run)."""
    trace_run = next(iter(runs), None)
    return {**settings, "harness": {**settings["harness"], "runs": runs, "trace_run": trace_run}}


def closed_loop(settings, model_source, sequences, shard, gates, out_dir, study=None) -> dict:
    """The closed-loop scorers decoding `shard` in the harness, interleaved in one process,
    then the causal rules of `study` (learned.causal.closed_loop) on its first sequences,
    interleaved in their turn; each run a results file and trace in `out_dir`. Their copies
    are checked against the replay's by the evaluation (scorers) and the causal check."""
    from moecache.harness import jobs
    from moecache.harness import runs as planned
    from moecache.schedule import accountant

    scorers = closed_loop_runs(settings["learned"]["closed_loop"], shard)
    causal, first = causal_loop(settings, shard, study)
    if not scorers and not causal:
        raise MoecacheError(f"shard {shard}: no scorer of learned.closed_loop applies to it")
    groups = [(decoding(settings, runs), cut) for runs, cut in ((scorers, None), (causal, first))]
    groups = [(group, cut) for group, cut in groups if group["harness"]["runs"]]
    for group, _ in groups:  # a bad rule or parameter refuses before the model loads
        planned.runs_for_shard(group, shard, shard)
    loaded = jobs.load(settings, model_source, sequences)
    longest = max(len(ids) for ids in loaded[1])
    memory = accountant.account(groups[0][0], source=model_source, tokens=longest, shard=shard)
    print("\n".join(accountant.lines(memory)))
    done = {}
    for group, cut in groups:
        done |= jobs.run_decode(
            group, model_source, sequences, shard, shard, gates, out_dir, first=cut, loaded=loaded
        )
    return done
