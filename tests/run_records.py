"""The records' files as the stages write them, for tests that build results folders by
hand: a decode run's results (records/run.py's RunResult) and its sequence rows, a batched
run's (BatchedRunResult), and the
replay stage's bounds, foresight curve and optimum sweep (records/replay.py); every field,
`fields` over the defaults."""

from __future__ import annotations

from moecache.records import replay
from moecache.records.run import BATCHED_SCHEMA, SCHEMA


def run_record(**fields) -> dict:
    overlapped = bool(fields.get("overlap"))
    base = {
        "schema": SCHEMA,
        "run": "lru",
        "policy": "lru",
        "params": {},
        "overlap": overlapped,
        "restricts": False,
        "prefetch": "none" if overlapped else None,
        "prefetch_params": {},
        "capacity": 16,
        "multiplier": 1,
        "shard": "a",
        "restricted_layers": [0, 1, 2, 3],
        "base_nll": 5.0,
        "gates": "results/gates/a.json",
        "trace_in": None,
        "interleaved_with": [],
        "twin_1x": None,
        "device_memory": {},
        "accountant": {},
        "sequences_decoded": [],
        "totals": {},
        "sequences": [],
        "settings": {"model": {"source": "embedded"}, "harness": {"trace_run": "lru"}},
        "settings_hash": "0" * 16,
        "versions": {},
        "device": "cpu",
        "device_name": "cpu",
    }
    return {**base, **fields}


def sequence_row(**fields) -> dict:
    """One sequence row of a blocking run's file (records/run.py's SequenceRow), every field,
    `fields` over the defaults (stall_seconds: copy_seconds, as a blocking run writes it)."""
    base = {
        "sequence": 0,
        "tokens": 0,
        "nll_sum": 0.0,
        "scored": 0,
        "timed_tokens": 0,
        "step_seconds": 0.0,
        "copy_seconds": 0.0,
        "timed_copies": 0,
        "copy_groups": 0,
        "fills": 0,
        "steady": 0,
        "step_repeats": [],
        "copy_repeats": [],
        "nll": 0.0,
    }
    row = {**base, **fields}
    row.setdefault("stall_seconds", row["copy_seconds"])
    return row


def bound_record(**fields) -> dict:
    """`moecache bound --out` (records/replay.py's BoundResult)."""
    base = {"capacity": 4, "experts": 8, "top_k": 2, "orders_tried": [], "totals": {}}
    return replay.stamped({**base, "streams": [], "mixed_precision": None, **fields})


def foresight_record(**fields) -> dict:
    """`moecache foresight --out` (records/replay.py's ForesightResult)."""
    base = {"capacity": 4, "heldout_sequences": 1, "rules": {}, "subsets": {}}
    return replay.stamped({**base, **fields})


def sweep_record(**fields) -> dict:
    """`moecache optimum-sweep --out` (records/replay.py's OptimumSweep)."""
    base = {
        "instances": 0,
        "seed": 0,
        "settings": {},
        "k_over_c": [],
        "greedy_not_optimal": 0,
        "lp_dp_disagreements": 0,
        "greedy_above_lru": 0,
        "cells": [],
        "not_optimal_instances": [],
        "settings_hash": "0" * 16,
        "versions": {},
        "device": "cpu",
        "device_name": "cpu",
        "inputs": [],
    }
    return replay.stamped({**base, **fields})


def batched_record(**fields) -> dict:
    """`moecache decode-batched` (records/run.py's BatchedRunResult)."""
    base = {
        "schema": BATCHED_SCHEMA,
        "run": "lru",
        "policy": "lru",
        "params": {},
        "capacity": 16,
        "shard": "a",
        "shape": "b4-static-p0",
        "lossless": True,
        "interleaved_with": [],
        "totals": {},
        "sequences": [],
        "batches": [],
        "settings": {},
        "settings_hash": "0" * 16,
        "versions": {},
        "device": "cpu",
        "device_name": "cpu",
    }
    return {**base, **fields}


# The stages' other files (records/gates.py, bandwidth.py, profile.py, router_tuning.py,
# accuracy.py, controller.py, training.py, replay.py's ReplayBenchmark): every field, schema
# first and the provenance stamp last, as the stages write them; `fields` over the defaults.
STAMP = {
    "settings": {},
    "settings_hash": "0" * 16,
    "versions": {},
    "device": "cpu",
    "device_name": "cpu",
}


def stamped_record(base: dict, fields: dict) -> dict:
    return {"schema": 1, **base, **STAMP, **fields}


def gates_record(**fields) -> dict:
    """`moecache gates` (records/gates.py's GatesResult), passed."""
    base = {
        "base": {"nll": 5.0, "tokens_per_second": 10.0},
        "batched_nll": 5.0,
        "runs": {},
        "reference_left_out": None,
        "min_throughput_ratio": 0.5,
        "gate_repeats": 1,
        "step_seconds": {},
        "throughput_ratio_pool_vs_own_block": 1.0,
        "throughput_ratio_ci": [0.9, 1.1],
        "failures": [],
        "accountant": {},
    }
    return stamped_record(base, fields)


def bandwidth_record(**fields) -> dict:
    """`moecache bandwidth` (records/bandwidth.py's BandwidthResult)."""
    base = {
        "experts": 8,
        "layers": 1,
        "expert_bytes": 1024,
        "tau_ms": 1.0,
        "group_overhead_ms": 0.0,
        "multipliers": {"1": {"tau_ms": 1.0, "group_overhead_ms": 0.0, "ratio_to_1x": 1.0}},
        "loop_gib_per_s": 1.0,
        "link": None,
        "link_ring_bytes": 0,
        "rounds": 1,
        "large_copy_ms": 1.0,
        "large_gib_per_s": 1.0,
    }
    return stamped_record(base, fields)


def link_record(**fields) -> dict:
    """`moecache link-check` (records/bandwidth.py's LinkCheckResult)."""
    base = {
        "policy": "lru",
        "capacity": 4,
        "multiplier": 10,
        "sequences": 1,
        "timed_tokens": 1,
        "runs": [],
    }
    return stamped_record(base, fields)


def profile_record(**fields) -> dict:
    """`moecache profile` (records/profile.py's ProfileResult): its device first."""
    base = {
        "device": "cpu",
        "expert_bytes": 1024,
        "expert_copy_ms": 1.0,
        "token_compute_ms": 1.0,
        "timed_tokens": 1,
        "heldout_nll": 5.0,
        "reuse_per_layer": [0.5],
        "reuse_shuffled_per_layer": [0.25],
        "copy_share_of_token": 1.0,
    }
    return stamped_record(base, fields)


def probe_record(**fields) -> dict:
    """`moecache probe` (records/profile.py's ProbeResult)."""
    base = {"probe": {"policy": "dwell", "params": {}}, "base_nll": 5.0, "layers": []}
    return stamped_record(base, fields)


def tuned_record(**fields) -> dict:
    """`moecache router-measure` (records/router_tuning.py's TunedModel)."""
    base = {
        "model": "base",
        "source": "model",
        "nll_comparable": True,
        "teacher_forced": {},
        "own_generations": {},
        "training": None,
    }
    return stamped_record(base, fields)


def tuning_log_record(**fields) -> dict:
    """`moecache router-train`'s training.json (records/router_tuning.py's TuningLog)."""
    base = {
        "variant": "hit",
        "source": "model",
        "steps": 0,
        "prompts": 0,
        "completions_per_step": 1,
        "log_sim_hit_rate": None,
        "log_reward": None,
        "greedy_sim_hit_rate": {"start": 0.5, "end": 0.5},
        "merge_max_logit_gap": 0.0,
        "log": [],
        "seconds": 1.0,
    }
    return stamped_record(base, fields)


def accuracy_record(**fields) -> dict:
    """`moecache accuracy`'s summary.json (records/accuracy.py's AccuracySummary)."""
    base = {
        "task": "moecache_docs",
        "questions": 0,
        "chance": 0.25,
        "switch_every": 8,
        "matched_thresholds": {},
        "rows": [],
    }
    return stamped_record(base, fields)


def benchmark_record(**fields) -> dict:
    """`moecache benchmark-replay` (records/replay.py's ReplayBenchmark)."""
    base = {
        "streams": 1,
        "tokens": 1,
        "requests": 1,
        "lp": {},
        "experts": 8,
        "top_k": 2,
        "capacity": 4,
        "rounds": 1,
        "rules": {},
    }
    return {**stamped_record(base, fields), "inputs": fields.get("inputs", [])}


def learned_record(**fields) -> dict:
    """`moecache learned-evaluate` (records/learned.py's LearnedEvaluation)."""
    base = {"capacity": 16, "shards": {}, "training": {}}
    return {**stamped_record(base, fields), "inputs": fields.get("inputs", [])}


def heads_record(**fields) -> dict:
    """`moecache controller-train`'s log beside its heads (records/controller.py's HeadsLog)."""
    base = {
        "schema": 1,
        "objective": "differentiable",
        "seed": 0,
        "price": 0.0,
        "tau_ms": 1.0,
        "weights": {},
        "capacity": 4,
        "steps": 1,
        "train_seconds": 1.0,
        "log": [{"step": 0, "objective": 1.0}],
    }
    return {**base, **fields}


def longer_record(**fields) -> dict:
    """`moecache controller-longer`'s summary.json (records/controller.py's LongerSummary)."""
    base = {"schema": 1, "tokens": 256, "piece_tokens": 128, "heads": "h.pt"}
    return {**base, "whole": {}, "pieces": {}, **fields}


def training_record(**fields) -> dict:
    """`moecache train`'s training.json (records/training.py's ModelTraining)."""
    base = {"schema": 1, "training_tokens": 1, "tokens_seen": 1, "parameters": 1, "log": []}
    return {**base, **fields}
