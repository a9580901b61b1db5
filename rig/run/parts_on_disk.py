"""What a point's request part files on disk hold: row counts and status counts (a file cut short counts as none)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rig.results import REQUESTS_DIR, part_paths


def _part_files(run_dir: Path, point: str) -> list[str]:
    return part_paths(Path(run_dir) / REQUESTS_DIR / f"point={point}")


def count_rows_on_disk(run_dir: Path, point: str) -> int:
    """Rows in a point's readable part files (a file cut short has no footer and counts as none)."""
    n = 0
    for f in _part_files(run_dir, point):
        with contextlib.suppress(OSError, pa.ArrowException):
            n += pq.read_metadata(f).num_rows
    return n


def rows_by_status(run_dir: Path, point: str) -> dict[str, int]:
    """ok/failed/cancelled counts of a point's readable part files."""
    statuses: list[str] = []
    for f in _part_files(run_dir, point):
        with contextlib.suppress(OSError, pa.ArrowException):
            statuses += pq.ParquetFile(f).read(columns=["status"]).column("status").to_pylist()
    return {k: statuses.count(k) for k in ("ok", "failed", "cancelled")}
