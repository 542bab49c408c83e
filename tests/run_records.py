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
