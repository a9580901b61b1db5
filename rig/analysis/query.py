"""``rig query``: a user's own question in SQL over one or several runs (DuckDB over the runs' Parquet, out-of-core).

Tables (every one has a ``run`` column: the run's id, or its directory's name where two runs share an id):

- ``requests``: one row per request record (rig.contracts.RequestRecord's columns), every closed part file.
- ``server_metrics``: the scraped /metrics samples (ts, name, labels, value) per point.
- ``gpu_metrics``: NVML samples of the server node's GPUs, where the run recorded them (absent without NVML).
- ``points``: one row per point of each manifest: identity, status, flags, window, scheduled requests, and the
  server knobs the point ran (``knobs``, JSON text: ``knobs->>'steps'``).
- ``server_configs``: one row per server configuration: engine, requested knobs, what ran (``effective``), the
  engine's server_info (JSON text), status and error.
- ``runs``: one row per run: directory, status, points.

DuckDB reads only the columns and row groups a query needs and spills joins, sorts and grouping to disk past its
memory limit (exact quantiles keep their values in memory: 0.8 GB for 100 M of them). Part files that cannot be
read (cut short by a crash) are left out with a warning, as ``rig report`` does.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import pyarrow as pa
import pyarrow.parquet as pq

from rig.analysis.query_output import OUTPUT_SUFFIXES, write_stream
from rig.analysis.query_sandbox import (
    QueryRefused,
    lock_down,
    output_clash,
    read_only,
    refuse_permission,
    remove_spill_directory,
    spill_directory,
)
from rig.analysis.query_tables import points_table, runs_table, server_configs_table
from rig.analysis.runs import AnalysisInputError, Run, load_run
from rig.results import REQUESTS_DIR, SERVER_METRICS_DIR, part_paths

if TYPE_CHECKING:
    import duckdb

GPU_METRICS_DIR = "gpu_metrics"  # rig.results names it once NVML telemetry lands; the layout is DESIGN.md's
FILE_TABLES = {"requests": REQUESTS_DIR, "server_metrics": SERVER_METRICS_DIR, "gpu_metrics": GPU_METRICS_DIR}
# DuckDB spills joins, sorts and grouping past this; exact quantiles of 100 M values hold them (0.8 GB) in memory
MEMORY_LIMIT = "2GB"


class QueryError(Exception):
    """The query itself is wrong (SQL DuckDB rejects, or a table these runs lack): one line, exit 2."""


# Warnings of one kind past this many are summed up in one line (a run with 500 cut-off parts buries no answer)
WARNINGS_OF_A_KIND = 3


@dataclass
class Opened:
    """A DuckDB connection with the runs' tables, the warnings met on the way, and which file tables exist."""

    con: duckdb.DuckDBPyConnection
    warnings: list[str]
    tables: list[str]
    run_dirs: list[Path] = field(default_factory=list)
    spill: Path | None = None

    def close(self) -> None:
        """Close the connection and remove its spill directory."""
        self.con.close()
        if self.spill is not None:
            remove_spill_directory(self.spill)


def _readable(files: list[str], warnings: list[str]) -> list[str]:
    """The part files whose Parquet footer reads (a file cut off mid-write has none); the others are warned about."""
    ok = []
    for f in files:
        try:
            pq.read_metadata(f)
            ok.append(f)
        except (OSError, pa.ArrowInvalid):
            warnings.append(f"unreadable part file skipped: {f}")
    return ok


def _names(runs: list[Run]) -> list[str]:
    """Each run's name in the ``run`` column: its id, or its directory where ids repeat."""
    ids = [r.run_id for r in runs]
    return [r.run_id if ids.count(r.run_id) == 1 else str(r.run_dir) for r in runs]


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def open_runs(run_dirs: list[Path]) -> Opened:
    """Load every run (one-line errors for a bad one), register its tables with a fresh DuckDB connection, and lock
    that connection down to reading them (rig.analysis.query_sandbox)."""
    import duckdb

    runs = [load_run(d) for d in run_dirs]
    names = _names(runs)
    warnings = [f"{n}: {w}" for r, n in zip(runs, names, strict=False) for w in r.warnings]
    spill = spill_directory()
    con = duckdb.connect(
        config={"memory_limit": MEMORY_LIMIT, "temp_directory": str(spill), "preserve_insertion_order": False}
    )  # ORDER BY orders; scans need not buffer
    con.execute("SET enable_progress_bar = false")  # rig prints the answer, nothing else
    tables, allowed = [], []
    for table, kind in FILE_TABLES.items():
        selects = []
        for run, name in zip(runs, names, strict=False):
            files = _readable(part_paths(run.run_dir / kind), warnings)
            allowed += files
            if files:
                listing = "[" + ", ".join(_sql_str(f) for f in files) + "]"
                # the run's name first; the records' own columns after (union_by_name: older runs lack newer columns)
                selects.append(f"SELECT {_sql_str(name)} AS run, * FROM read_parquet({listing}, union_by_name = true)")
        if selects:
            con.execute(f"CREATE VIEW {table} AS " + " UNION ALL BY NAME ".join(selects))
            tables.append(table)
    for table, data in (
        ("points", points_table(runs, names)),
        ("server_configs", server_configs_table(runs, names)),
        ("runs", runs_table(runs, names)),
    ):
        con.register(f"_{table}", data)
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM _{table}")
        tables.append(table)
    lock_down(con, allowed)
    return Opened(con, warnings, tables, list(run_dirs), spill)


def _one_line(e: Exception, opened: Opened) -> str:
    """DuckDB's message on one line, and the tables these runs have when the query named one they lack."""
    msg = " ".join(str(e).split())
    missing = [t for t in FILE_TABLES if t not in opened.tables and t in str(e)]
    if missing:
        msg += (
            f" (these runs have no {missing[0]}"
            + (": it is recorded only where the server node has NVML" if missing[0] == "gpu_metrics" else "")
            + f"; tables: {', '.join(opened.tables)})"
        )
    return msg


def _query_error(e: Exception, opened: Opened) -> Exception:
    import duckdb

    if isinstance(e, duckdb.PermissionException):
        return QueryRefused(refuse_permission(str(e)))
    return QueryError(_one_line(e, opened))


def _reader(opened: Opened, sql: str) -> pa.RecordBatchReader | None:
    """The query's rows as a stream of Arrow batches (None for a statement with no result), once DuckDB's parser
    says it only reads."""
    read_only(opened.con, sql)
    rel = opened.con.sql(sql)
    if rel is None:
        return None
    # DuckDB 1.4 renamed fetch_record_batch (kept, deprecated) to to_arrow_reader
    return rel.to_arrow_reader(10_000) if hasattr(rel, "to_arrow_reader") else rel.fetch_record_batch(10_000)


def run_query(opened: Opened, sql: str, limit: int | None = None) -> tuple[pa.Table, bool]:
    """The query's first ``limit`` rows (all when None) as an Arrow table, and whether it has more."""
    import duckdb

    try:
        reader = _reader(opened, sql)
        if reader is None:
            return pa.table({}), False
        batches, rows = [], 0
        for batch in reader:
            batches.append(batch)
            rows += batch.num_rows
            if limit is not None and rows > limit:
                break
    except duckdb.Error as e:
        raise _query_error(e, opened) from None
    table = pa.Table.from_batches(batches, schema=reader.schema)
    if limit is not None and table.num_rows > limit:
        return table.slice(0, limit), True
    return table, False


def write_query(opened: Opened, sql: str, out: Path) -> int:
    """Stream the query's result into ``out`` (.parquet or .csv; rig writes it, DuckDB writes nothing); returns the
    rows written. A path inside a run directory is refused."""
    import duckdb

    suffix = out.suffix.lower()
    if suffix not in OUTPUT_SUFFIXES:
        raise AnalysisInputError(f"-o {out}: the output must end in {' or '.join(OUTPUT_SUFFIXES)}")
    clash = output_clash(out, opened.run_dirs)
    if clash:
        raise QueryRefused(clash)
    try:
        reader = _reader(opened, sql)
        if reader is None:
            raise QueryError("the statement returns no rows to write")
        rows = write_stream(reader, out)
    except duckdb.Error as e:
        raise _query_error(e, opened) from None
    return rows


# --- the command ----------------------------------------------------------------------------------------------------


def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:,.6g}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, datetime):
        return v.isoformat(sep=" ")
    if isinstance(v, date | time):
        return v.isoformat()
    if isinstance(v, timedelta):
        return str(v)
    if isinstance(v, pa.MonthDayNano):
        return _interval(v)
    return str(v)


def _interval(v: pa.MonthDayNano) -> str:
    """A DuckDB INTERVAL as DuckDB prints it (``1 month 2 days 00:00:03``)."""
    parts = [f"{n} {unit}{'s' if n != 1 else ''}" for n, unit in ((v.months, "month"), (v.days, "day")) if n]
    if v.nanoseconds or not parts:
        parts.append(str(timedelta(microseconds=v.nanoseconds / 1000)))
    return " ".join(parts)


def summed_warnings(warnings: list[str]) -> list[str]:
    """Each warning once; past WARNINGS_OF_A_KIND of one kind (the text before its last ': '), one line for the rest."""
    unique = list(dict.fromkeys(warnings))
    kinds = Counter(w.rsplit(": ", 1)[0] for w in unique)
    shown: Counter[str] = Counter()
    lines = []
    for w in unique:
        kind = w.rsplit(": ", 1)[0]
        shown[kind] += 1
        if shown[kind] <= WARNINGS_OF_A_KIND:
            lines.append(w)
        elif shown[kind] == WARNINGS_OF_A_KIND + 1:
            lines.append(f"{kind}: {kinds[kind] - WARNINGS_OF_A_KIND:,} more")
    return lines


def _rich_table(table: pa.Table) -> Any:
    """The result as a rich Table, column by column: columns that share a name keep their own values."""
    from rich.table import Table

    t = Table(header_style="bold")
    for f in table.schema:
        numeric = pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type)
        t.add_column(f.name, justify="right" if numeric else "left", overflow="fold")
    columns = [c.to_pylist() for c in table.columns]
    for i in range(table.num_rows):
        t.add_row(*(_cell(col[i]) for col in columns))
    return t


@click.command("query")
@click.argument("sql")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write every row of the result to FILE.parquet or FILE.csv (outside any run directory) instead of printing "
    "a table.",
)
@click.option(
    "--limit",
    type=click.IntRange(1),
    default=100,
    show_default=True,
    help="Rows the terminal table shows (-o writes all of them).",
)
def query(sql: str, runs: tuple[Path, ...], output: Path | None, limit: int) -> None:
    """Answer a question in SQL over one or several runs (DuckDB, read-only: the runs named and nothing else).
    Tables: requests, server_metrics, gpu_metrics (where recorded), points, server_configs, runs; each has a ``run``
    column. Example:

    rig query "SELECT point, quantile_cont(ttft_s, 0.99) AS ttft_p99 FROM requests WHERE ok GROUP BY point" RUN
    """
    from rich.console import Console

    from rig.analysis.cli import InputError

    err = Console(stderr=True, soft_wrap=True)  # a warning stays one line, however narrow the terminal
    opened = None
    try:
        opened = open_runs(list(runs))
        for w in summed_warnings(opened.warnings):
            err.print(f"! {w}", style="yellow", markup=False, highlight=False)
        if output is not None:
            n = write_query(opened, sql, output)
            err.print(f"wrote {n:,} row(s) to {output}")
            return
        table, more = run_query(opened, sql, limit)
    except (AnalysisInputError, QueryError, QueryRefused) as e:
        raise InputError(" ".join(str(e).split()) or type(e).__name__) from None
    except OSError as e:
        raise click.ClickException(str(e).splitlines()[0]) from None
    finally:
        if opened is not None:
            opened.close()
    Console(width=None if Console().is_terminal else 200).print(_rich_table(table))
    if more:
        err.print(f"first {limit:,} rows shown (--limit N for more, -o FILE.parquet|FILE.csv for every row)")
