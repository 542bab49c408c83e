"""The harness's trace format, written: one Parquet row per restricted layer, sequence and
token, with the experts the router requested, the experts used and the router's
probabilities; the file's metadata names the run that recorded it. The columns and the
reading live in records/trace.py (farthest-future runs read it back as futures, trace replay
and the stages as demand).
"""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from moecache.atomic import atomic_file
from moecache.records.trace import COLUMNS, ORIGIN_KEY


def write(trace: list[dict], path, origin: dict) -> None:
    """Per layer and token: requested experts, experts used, router probabilities. The
    file's metadata records the run that made it (`origin`), so that what is computed from
    the trace alone can still name its config hash and device."""
    frame = pd.DataFrame(trace, columns=COLUMNS)
    frame["probs"] = frame["probs"].map(lambda p: p.astype("float32"))
    table = pa.Table.from_pandas(frame, preserve_index=False)
    metadata = {**table.schema.metadata, ORIGIN_KEY: json.dumps(origin).encode()}
    with atomic_file(path) as tmp:
        pq.write_table(table.replace_schema_metadata(metadata), tmp)
