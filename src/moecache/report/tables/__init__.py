"""The paper's tables, every cell computed from the pipeline's results files.

Each builder returns a `Table`: its rows (one DataFrame per part), its notes and its
verdicts as separate fields; `write` renders them as CSV, Markdown and sources. A table
whose inputs the config does not produce says so in its caption and has no rows.
"""

from moecache.atomic import read_json as read
from moecache.report.tables.appendix import table_bounds, table_controller, table_eviction
from moecache.report.tables.base import Table, write
from moecache.report.tables.batching import table_batching
from moecache.report.tables.table1 import (
    cost_model_part,
    scaled_points,
    table1,
    table_replication,
)
from moecache.report.tables.table2 import table2
from moecache.report.tables.table3 import table3
from moecache.report.tables.tiers import table_tiers

# Name -> (builder, the input flags it reads: its parameters); `moecache table` refuses others.
BUILDERS = {
    "table1": (table1, ("runs", "scaled", "bandwidth", "gpu_check")),
    "table2": (table2, ("accuracy",)),
    "table3": (table3, ("router",)),
    "table_controller": (table_controller, ("sweep", "longer", "controller")),
    "table_eviction": (table_eviction, ("replay", "learned")),
    "table_bounds": (table_bounds, ("bound", "sweep")),
    "table_replication": (table_replication, ("runs", "replication")),
    "table_batching": (table_batching, ("replay", "batched")),
    "table_tiers": (table_tiers, ("tiers_grid", "tiers_measured")),
}

# read and scaled_points: figures.py takes them from here.
__all__ = [
    "BUILDERS",
    "Table",
    "cost_model_part",
    "read",
    "scaled_points",
    "table1",
    "table2",
    "table3",
    "write",
]
