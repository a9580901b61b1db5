"""Results on disk: the per-request Parquet schema, the crash-safe part writer, the manifest and readers.

Layout (README, "Results on disk"):
    results/<run_id>/manifest.json
    results/<run_id>/requests/point=<p>/gen=<g>/part-NNNNN.parquet
    results/<run_id>/server_metrics/point=<p>/part-NNNNN.parquet
    results/<run_id>/gpu_metrics/point=<p>/part-NNNNN.parquet     (NVML or simulated GPU samples; absent without)
    results/<run_id>/logs/server=<config_id>/server.log      (one server launch serves several points)

A Parquet file cut off mid-write has no footer and is unreadable, so nothing lives only in an open file: rows are
buffered in memory and every few seconds (or rows) a whole part file is written as ``.tmp`` and renamed.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from rig import contracts

MANIFEST = "manifest.json"
REQUESTS_DIR = "requests"
SERVER_METRICS_DIR = "server_metrics"
GPU_METRICS_DIR = "gpu_metrics"
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

# One row per GPU per sample (rig/server/gpu_telemetry.py), NVML's units. ts is the server node's clock; source is
# "nvml" or "simulated" (the simulator's power model, rig/sim/power.py). A field the GPU does not support is null and
# named in errors.
GPU_METRICS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("point", pa.string()),
        ("node", pa.string()),  # the server node's IP
        ("ts", pa.float64()),
        ("source", pa.string()),
        ("gpu_index", pa.int32()),  # NVML's index
        ("gpu_uuid", pa.string()),
        ("gpu_name", pa.string()),
        ("power_mw", pa.int64()),
        ("energy_mj", pa.int64()),  # total-energy counter since the driver loaded (monotonic)
        ("util_gpu_pct", pa.int32()),
        ("util_mem_pct", pa.int32()),
        ("mem_used_bytes", pa.int64()),
        ("mem_total_bytes", pa.int64()),
        ("sm_clock_mhz", pa.int32()),
        ("temperature_c", pa.int32()),
        ("throttle_reasons", pa.int64()),  # NVML's clock event reasons bitmask
        ("power_limit_mw", pa.int64()),
        ("sample_s", pa.float64()),  # how long the round of NVML calls took
        ("errors", pa.string()),
    ]
)


empty_record = contracts.empty_record

# A disk that is full, over quota or failing for a moment: a write is tried again (a full disk is often freed
# within seconds by a log rotation or a cleanup; the issue-23 case was ~8 s). Any other error is not retried.
TRANSIENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EAGAIN, errno.EINTR})
RETRY_S = 30.0  # how long a closing write (or a manifest write) keeps retrying a transient error
RETRY_FIRST_S, RETRY_MAX_S = 0.1, 2.0  # backoff between attempts: doubling from the first to the max


def retry_transient(
    fn: Callable[[], Any], retry_s: float = RETRY_S, on_error: Callable[[OSError], object] | None = None
) -> Any:
    """``fn()``, tried again with backoff while it raises a transient OSError (TRANSIENT_ERRNOS), for up to
    ``retry_s``; then (or at once for any other error) its error is raised. ``on_error`` sees every failure."""
    deadline = time.monotonic() + retry_s
    delay = RETRY_FIRST_S
    while True:
        try:
            return fn()
        except OSError as e:
            if on_error is not None:
                on_error(e)
            if e.errno not in TRANSIENT_ERRNOS or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, RETRY_MAX_S)


# Rows per piece of a TableBuilder, by column kind: each piece is ~0.05-0.1 ms of conversion.
PIECE_ROWS_LIST, PIECE_ROWS_TEXT, PIECE_ROWS_SCALAR = 64, 128, 512


class TableBuilder:
    """Rows (dicts) to an Arrow table in bounded pieces: ``step()`` converts one column over one range of rows.

    The table equals ``pa.Table.from_pylist(rows, schema=schema)`` (a missing key is null, as there), but a caller
    on an event loop can let other work go between pieces, and it costs less: ``from_pylist`` spends ~0.4 ms per
    call setting up its 53 columns, so converting a few rows at a time (to keep each step short) cost 20-60 us per
    row; a column at a time over hundreds of rows costs ~9 us per row.
    """

    def __init__(
        self, rows: list[dict[str, Any]], schema: pa.Schema, repair: Callable[[dict[str, Any]], object] | None = None
    ) -> None:
        self.rows = rows
        self.schema = schema
        self.repair = repair  # makes a row Arrow cannot convert convertible, in place; without it: an error
        self._repaired: set[int] = set()  # ids of the rows repaired (a row repaired twice is a bug: raise)
        self._plan()

    def _plan(self) -> None:
        self._chunks: list[list[pa.Array]] = [[] for _ in self.schema]
        self._todo: list[tuple[int, int, int]] = []  # (column, first row, end row), done from the end
        n = len(self.rows)
        for i, f in enumerate(self.schema):
            t = f.type
            size = (
                PIECE_ROWS_LIST
                if pa.types.is_list(t) or pa.types.is_large_list(t)
                else PIECE_ROWS_TEXT
                if pa.types.is_string(t) or pa.types.is_binary(t)
                else PIECE_ROWS_SCALAR
            )
            self._todo += [(i, a, min(a + size, n)) for a in range(0, n, size)]
        self._todo.reverse()

    @property
    def done(self) -> bool:
        return not self._todo

    def step(self) -> None:
        """Convert the next piece (one column, one range of rows)."""
        i, a, b = self._todo[-1]
        field = self.schema.field(i)
        name = field.name
        try:
            chunk = pa.array([r.get(name) for r in self.rows[a:b]], type=field.type)
        except contracts.CONVERSION_ERRORS:
            if self.repair is None or not self._repair_rows(a, b):
                raise
            self._plan()  # a repair changes other columns of its row too (status, error): convert afresh
            return
        self._todo.pop()
        self._chunks[i].append(chunk)

    def _repair_rows(self, a: int, b: int) -> int:
        """Repair the rows of ``rows[a:b]`` that do not convert (found one at a time); how many were."""
        assert self.repair is not None
        fixed = 0
        for row in self.rows[a:b]:
            try:
                pa.RecordBatch.from_pylist([row], schema=self.schema)
            except contracts.CONVERSION_ERRORS:
                if id(row) in self._repaired:
                    raise  # the repair did not make it convertible: never loop
                self.repair(row)
                self._repaired.add(id(row))
                fixed += 1
        return fixed

    def build(self) -> pa.Table:
        """Every remaining piece, then the table."""
        while self._todo:
            self.step()
        return self.table()

    def table(self) -> pa.Table:
        assert not self._todo, "pieces left to convert"
        cols = [pa.chunked_array(chunks, type=f.type) for chunks, f in zip(self._chunks, self.schema, strict=True)]
        return pa.Table.from_arrays(cols, schema=self.schema)


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

    A disk that fails for a while (full, I/O error: TRANSIENT_ERRNOS) never costs rows: a part that cannot be
    written keeps its rows buffered; ``maybe_flush`` records the error and leaves them for its next call, ``close``
    retries for ``retry_s`` with backoff, then raises with the rows still counted in ``pending`` (the caller
    reports them as not written). ``last_error`` and ``write_failures`` say what happened.
    """

    def __init__(
        self,
        directory: Path | str,
        schema: pa.Schema,
        *,
        max_rows: int = 5000,
        max_age_s: float = 2.0,
        repair: Callable[[dict[str, Any]], object] | None = None,
        retry_s: float = RETRY_S,
    ):
        self.directory = Path(directory)
        self.retry_s = retry_s
        self.last_error: str | None = None  # the last write that failed, in a few words
        self.write_failures = 0
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
            with contextlib.suppress(
                OSError
            ):  # recorded by write(); the rows stay buffered for the next call or close()
                self.flush()

    def flush(self) -> None:
        rows = self.take(force=True)
        if not rows:
            return
        try:
            table = self.builder(rows).build()
        except BaseException:  # rows that do not convert stay buffered (reported unwritten), never dropped
            self.untake(rows)
            raise
        self.write(rows, table)

    def builder(self, rows: list[dict[str, Any]]) -> TableBuilder:
        """``rows`` to Arrow in bounded pieces; a row that does not convert is repaired in place (with ``repair``),
        so one bad value never takes the other rows down."""
        return TableBuilder(rows, self.schema, repair=self._repair_row if self.repair is not None else None)

    def _repair_row(self, row: dict[str, Any]) -> None:
        assert self.repair is not None
        self.repair(row)
        self.rows_repaired += 1

    def take(self, force: bool = False) -> list[dict[str, Any]]:
        """The buffered rows if a part is due (or ``force``); the buffer starts afresh. Cheap: a swap."""
        with self._lock:
            due = self._rows and (
                force or len(self._rows) >= self.max_rows or time.monotonic() - (self._oldest or 0) >= self.max_age_s
            )
            if not due:
                return []
            rows, self._rows = self._rows, []
            return rows

    def untake(self, rows: list[dict[str, Any]]) -> None:
        """Taken rows that were not written go back to the front of the buffer (a failed or stopped write)."""
        with self._lock:
            self._rows = rows + self._rows

    def write(self, rows: list[dict[str, Any]], table: pa.Table) -> None:
        """Write taken rows (already converted to ``table``) as the next part; on failure they go back."""
        with self._write_lock:  # one part at a time, numbered in order; adding rows meanwhile is not blocked
            path = self.directory / part_name(self._next_part)
            try:
                atomic_write(path, table)
            except OSError as e:
                # Disk full or unwritable: keep the rows for the next attempt, drop the half-written temp file.
                self.untake(rows)
                with contextlib.suppress(OSError):
                    path.with_name(path.name + ".tmp").unlink()
                self.write_failures += 1
                self.last_error = f"{path.name}: {e.strerror or e}"
                raise
            self._next_part += 1
            self.rows_written += len(rows)
            self.parts.append(path.name)

    @property
    def pending(self) -> int:
        return len(self._rows)

    def close(self) -> None:
        """Write every buffered row, retrying a transient disk error for ``retry_s`` (then raising it)."""
        retry_transient(self.flush, self.retry_s)


# What a run directory holds of its own (an output path there would overwrite the run's data).
RUN_OWN = frozenset({MANIFEST, REQUESTS_DIR, SERVER_METRICS_DIR, LOGS_DIR, "gpu_metrics", "superseded", ".lock"})


def run_file_clash(path: Path | str) -> str | None:
    """Why writing ``path`` (a file or a directory of outputs) would overwrite a run's own files, or None.

    A run's own files are its manifest and everything under its records, metrics, logs and superseded folders;
    a file next to them (``RUN/report.html``) is fine."""
    target = Path(path).expanduser().resolve()
    for run in target.parents:
        if not (run / MANIFEST).is_file():
            continue
        first = target.relative_to(run).parts[0]
        if first in RUN_OWN:
            return f"{path} is inside run {run}'s own {first}"
    return None


def requests_dir(run_dir: Path, point: str, generator: int) -> Path:
    return Path(run_dir) / REQUESTS_DIR / f"point={point}" / f"gen={generator}"


def server_metrics_dir(run_dir: Path, point: str) -> Path:
    return Path(run_dir) / SERVER_METRICS_DIR / f"point={point}"


def gpu_metrics_dir(run_dir: Path, point: str) -> Path:
    return Path(run_dir) / GPU_METRICS_DIR / f"point={point}"


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


def read_gpu_metrics(run_dir: Path | str, columns: Iterable[str] | None = None) -> pa.Table:
    return _read_parts(Path(run_dir) / GPU_METRICS_DIR, GPU_METRICS_SCHEMA, columns)


# user:password@ (or a token@) in any URL: a secret the manifest must not hold (the scheme and host stay readable).
# Up to the authority's last "@", as urlsplit reads it: a password may hold "@" itself ("pa@ss" left "ss" showing).
_URL_CREDENTIALS = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s\"'?#]*@")
MASKED_CREDENTIALS = "***@"


def mask_url_credentials(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced: http://u:p@h:1/ -> http://***@h:1/."""
    return _URL_CREDENTIALS.sub(lambda m: m.group("scheme") + MASKED_CREDENTIALS, text)


def write_manifest(run_dir: Path | str, manifest: contracts.Manifest) -> None:
    """Write the manifest atomically (a transient disk error is retried: see retry_transient), with any URL's
    credentials masked."""
    text = mask_url_credentials(manifest.to_json())
    retry_transient(lambda: atomic_write(Path(run_dir) / MANIFEST, text))


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
