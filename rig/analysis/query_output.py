"""``rig query -o``: the result's Arrow batches streamed into a Parquet or CSV file (rig writes it, not DuckDB)."""

from __future__ import annotations

import csv
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

OUTPUT_SUFFIXES = (".parquet", ".csv")


def _csv_value(v: object) -> object:
    return "" if v is None else v


def write_stream(reader: pa.RecordBatchReader, out: Path) -> int:
    """Write every batch of ``reader`` to ``out`` (by its suffix) and return the rows written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = 0
    if out.suffix.lower() == ".parquet":
        with pq.ParquetWriter(out, reader.schema) as writer:
            for batch in reader:
                writer.write_batch(batch)
                rows += batch.num_rows
        return rows
    with out.open("w", newline="") as f:
        # the csv module quotes only what needs it (Arrow's writer quotes every string)
        w = csv.writer(f)
        w.writerow(reader.schema.names)
        for batch in reader:
            columns = [c.to_pylist() for c in batch.columns]
            w.writerows([_csv_value(col[i]) for col in columns] for i in range(batch.num_rows))
            rows += batch.num_rows
    return rows
