"""Results on disk: the per-request Parquet schema, the crash-safe part writer, the manifest and readers.

Layout (README, "Results on disk"):
    results/<run_id>/manifest.json
    results/<run_id>/requests/point=<p>/gen=<g>/part-NNNNN.parquet
    results/<run_id>/server_metrics/point=<p>/part-NNNNN.parquet
    results/<run_id>/logs/server=<config_id>/server.log      (one server launch serves several points)

A Parquet file cut off mid-write has no footer and is unreadable, so nothing lives only in an open file: rows are
buffered in memory and every few seconds (or rows) a whole part file is written as ``.tmp`` and renamed.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from rig import contracts

MANIFEST = "manifest.json"
REQUESTS_DIR = "requests"
SERVER_METRICS_DIR = "server_metrics"
LOGS_DIR = "logs"
PART_GLOB = "part-*.parquet"  # rows are written in whole part files, numbered from part-00000.parquet

# One row per request: the schema is generated from rig.contracts.RequestRecord (names, order and types).
REQUEST_SCHEMA = contracts.REQUEST_SCHEMA

SERVER_METRICS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("point", pa.string()),
        ("ts", pa.float64()),
        ("name", pa.string()),
        ("labels", pa.string()),  # JSON object, keys sorted
        ("value", pa.float64()),
    ]
)


empty_record = contracts.empty_record


def atomic_write(path: Path, content: pa.Table | str | bytes) -> None:
    """Write ``path`` whole or not at all: the content goes to a ``.tmp`` sibling that is renamed over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if isinstance(content, pa.Table):
        pq.write_table(content, tmp)
    elif isinstance(content, str):
        tmp.write_text(content)
    else:
        tmp.write_bytes(content)
    os.replace(tmp, path)


def part_name(number: int) -> str:
    """The file name of a directory's part ``number``."""
    return f"part-{number:05d}.parquet"


def is_part_name(name: str) -> bool:
    """A closed part file (a half-written one ends in ``.tmp`` and is never read)."""
    return fnmatch.fnmatchcase(name, PART_GLOB)


def part_paths(root: Path) -> list[str]:
    """The closed part files under ``root`` at any depth, as sorted path strings (none if it does not exist)."""
    return sorted(str(p) for p in root.rglob(PART_GLOB)) if root.exists() else []


class PartWriter:
    """Buffers rows and writes closed Parquet part files into one directory.

    ``add`` is cheap; ``maybe_flush`` writes a part when the buffer is old or large; ``close`` writes the rest.
    Thread-safe, so a flusher task and the request path may share it. ``repair``: called with a row Arrow cannot
    convert, to make it convertible in place (``contracts.repair_record``); without it such a row is an error.
    """

    def __init__(self, directory: Path | str, schema: pa.Schema, *, max_rows: int = 5000, max_age_s: float = 2.0,
                 repair: Callable[[dict[str, Any]], object] | None = None):
        self.directory = Path(directory)
        self.schema = schema
        self.repair = repair
        self.rows_repaired = 0
        self.max_rows = max_rows
        self.max_age_s = max_age_s
        self._rows: list[dict[str, Any]] = []
        self._oldest: float | None = None
        self._next_part = self._first_free_part()
        self._lock = threading.Lock()  # guards the buffer only: adding a row never waits behind a write
        self._write_lock = threading.Lock()
        self.rows_written = 0
        self.parts: list[str] = []

    def _first_free_part(self) -> int:
        if not self.directory.exists():
            return 0
        taken = [int(p.stem.split("-")[1]) for p in self.directory.glob(PART_GLOB)]
        return max(taken) + 1 if taken else 0

    def add(self, row: dict[str, Any]) -> None:
        with self._lock:
            if not self._rows:
                self._oldest = time.monotonic()
            self._rows.append(row)

    def maybe_flush(self) -> None:
        with self._lock:
            due = self._rows and (
                len(self._rows) >= self.max_rows or time.monotonic() - (self._oldest or 0) >= self.max_age_s
            )
        if due:
            self.flush()

    def flush(self) -> None:
        rows = self.take(force=True)
        if not rows:
            return
        try:
            batch = self.to_batch(rows)
        except BaseException:  # rows that do not convert stay buffered (reported unwritten), never dropped
            self.untake(rows)
            raise
        self.write(rows, [batch])

    def to_batch(self, rows: list[dict[str, Any]]) -> pa.RecordBatch:
        """``rows`` as one Arrow batch; a row that does not convert is repaired in place (with ``repair``), so one
        bad value never takes the other rows down."""
        try:
            return pa.RecordBatch.from_pylist(rows, schema=self.schema)
        except contracts.CONVERSION_ERRORS:
            if self.repair is None:
                raise
        for row in rows:  # find the bad row(s): one at a time
            try:
                pa.RecordBatch.from_pylist([row], schema=self.schema)
            except contracts.CONVERSION_ERRORS:
                self.repair(row)
                self.rows_repaired += 1
        return pa.RecordBatch.from_pylist(rows, schema=self.schema)

    def take(self, force: bool = False) -> list[dict[str, Any]]:
        """The buffered rows if a part is due (or ``force``); the buffer starts afresh. Cheap: a swap."""
        with self._lock:
            due = self._rows and (force or len(self._rows) >= self.max_rows
                                  or time.monotonic() - (self._oldest or 0) >= self.max_age_s)
            if not due:
                return []
            rows, self._rows = self._rows, []
            return rows

    def untake(self, rows: list[dict[str, Any]]) -> None:
        """Taken rows that were not written go back to the front of the buffer (a failed or stopped write)."""
        with self._lock:
            self._rows = rows + self._rows

    def write(self, rows: list[dict[str, Any]], batches: list[pa.RecordBatch]) -> None:
        """Write taken rows (already converted to ``batches``) as the next part; on failure they go back."""
        with self._write_lock:  # one part at a time, numbered in order; adding rows meanwhile is not blocked
            path = self.directory / part_name(self._next_part)
            try:
                atomic_write(path, pa.Table.from_batches(batches, schema=self.schema))
            except OSError:
                # Disk full or unwritable: keep the rows for the next attempt, drop the half-written temp file.
                self.untake(rows)
                with contextlib.suppress(OSError):
                    path.with_name(path.name + ".tmp").unlink()
                raise
            self._next_part += 1
            self.rows_written += len(rows)
            self.parts.append(path.name)

    @property
    def pending(self) -> int:
        return len(self._rows)

    def close(self) -> None:
        self.flush()


def requests_dir(run_dir: Path, point: str, generator: int) -> Path:
    return Path(run_dir) / REQUESTS_DIR / f"point={point}" / f"gen={generator}"


def server_metrics_dir(run_dir: Path, point: str) -> Path:
    return Path(run_dir) / SERVER_METRICS_DIR / f"point={point}"


def server_log_path(run_dir: Path, config_id: str) -> Path:
    return Path(run_dir) / LOGS_DIR / f"server={config_id}" / "server.log"


def _read_parts(root: Path, schema: pa.Schema, columns: Iterable[str] | None) -> pa.Table:
    files = part_paths(root)
    cols = list(columns) if columns is not None else None
    if not files:
        return schema.empty_table().select(cols) if cols else schema.empty_table()
    # Partition values are columns already; read files without hive inference so the schema stays ours.
    dataset = ds.dataset(files, schema=schema, format="parquet")
    return dataset.to_table(columns=cols)


def read_requests(run_dir: Path | str, columns: Iterable[str] | None = None) -> pa.Table:
    """Every request record of a run (all points, all generators)."""
    return _read_parts(Path(run_dir) / REQUESTS_DIR, REQUEST_SCHEMA, columns)


def read_server_metrics(run_dir: Path | str, columns: Iterable[str] | None = None) -> pa.Table:
    return _read_parts(Path(run_dir) / SERVER_METRICS_DIR, SERVER_METRICS_SCHEMA, columns)


def write_manifest(run_dir: Path | str, manifest: contracts.Manifest) -> None:
    """Write the manifest atomically."""
    atomic_write(Path(run_dir) / MANIFEST, manifest.to_json())


def load_manifest(run_dir: Path | str) -> contracts.Manifest:
    """The run's manifest, validated (older versions migrated); FileNotFoundError, or ContractError in one line."""
    path = Path(run_dir) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} is not a rig run directory (no {MANIFEST})")
    return contracts.parse_manifest(path.read_text(), str(path))


def read_manifest(run_dir: Path | str) -> dict[str, Any]:
    """The manifest's JSON as written, unvalidated (for tests and tools that inspect the file); rig reads it with
    ``load_manifest``."""
    path = Path(run_dir) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} is not a rig run directory (no {MANIFEST})")
    return json.loads(path.read_text())
