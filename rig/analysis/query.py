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

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import pyarrow as pa
import pyarrow.parquet as pq

from rig.analysis.runs import AnalysisInputError, Run, load_run
from rig.results import REQUESTS_DIR, SERVER_METRICS_DIR, part_paths

if TYPE_CHECKING:
    import duckdb

GPU_METRICS_DIR = "gpu_metrics"  # rig.results names it once NVML telemetry lands; the layout is DESIGN.md's
FILE_TABLES = {"requests": REQUESTS_DIR, "server_metrics": SERVER_METRICS_DIR, "gpu_metrics": GPU_METRICS_DIR}
# DuckDB spills joins, sorts and grouping past this; exact quantiles of 100 M values hold them (0.8 GB) in memory
MEMORY_LIMIT = "2GB"
OUTPUT_SUFFIXES = (".parquet", ".csv")


class QueryError(Exception):
    """The query itself is wrong (SQL DuckDB rejects, or a table these runs lack): one line, exit 2."""


@dataclass
class Opened:
    """A DuckDB connection with the runs' tables, the warnings met on the way, and which file tables exist."""

    con: duckdb.DuckDBPyConnection
    warnings: list[str]
    tables: list[str]


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


def _json(x: Any) -> str | None:
    return None if x is None else json.dumps(x, sort_keys=True, default=str)


def points_table(runs: list[Run], names: list[str]) -> pa.Table:
    """The ``points`` table: the manifests' points as analysis sees them (rig.analysis.runs.PointInfo)."""
    rows = []
    for run, name in zip(runs, names, strict=False):
        for p in run.points:
            wa = p.window_acceptance
            rows.append(
                {
                    "run": name,
                    "point": p.point,
                    "server_config": p.server_config,
                    "engine": p.engine,
                    "workload": p.workload,
                    "steps": p.steps,
                    "load_mode": p.load_mode,
                    "concurrency": p.concurrency,
                    "rate": p.rate,
                    "repeat": p.repeat,
                    "status": p.status,
                    "error": p.error,
                    "flags": list(p.flags),
                    "started_ts": p.started_ts,
                    "ended_ts": p.ended_ts,
                    "requests_planned": p.requests_planned,
                    "requests_scheduled": p.requests_scheduled,
                    "window_accept_length": wa.accept_length if wa is not None else None,
                    "in_manifest": p.in_manifest,
                    "knobs": _json(p.knobs),
                }
            )
    schema = pa.schema(
        [
            ("run", pa.string()),
            ("point", pa.string()),
            ("server_config", pa.string()),
            ("engine", pa.string()),
            ("workload", pa.string()),
            ("steps", pa.int64()),
            ("load_mode", pa.string()),
            ("concurrency", pa.int64()),
            ("rate", pa.float64()),
            ("repeat", pa.int64()),
            ("status", pa.string()),
            ("error", pa.string()),
            ("flags", pa.list_(pa.string())),
            ("started_ts", pa.float64()),
            ("ended_ts", pa.float64()),
            ("requests_planned", pa.int64()),
            ("requests_scheduled", pa.int64()),
            ("window_accept_length", pa.float64()),
            ("in_manifest", pa.bool_()),
            ("knobs", pa.string()),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def server_configs_table(runs: list[Run], names: list[str]) -> pa.Table:
    """The ``server_configs`` table: one row per configuration of each manifest."""
    rows = []
    for run, name in zip(runs, names, strict=False):
        for cid, cfg in run.manifest.server_configs.items():
            rows.append(
                {
                    "run": name,
                    "server_config": cid,
                    "engine": cfg.engine,
                    "status": cfg.status,
                    "error": cfg.error,
                    "knobs": _json(cfg.knobs),
                    "effective": _json(cfg.effective.model_dump(mode="json") if cfg.effective is not None else None),
                    "server_info": _json(cfg.server_info),
                    "ready_after_s": cfg.ready_after_s,
                    "adaptive": _json(cfg.adaptive.model_dump(mode="json") if cfg.adaptive is not None else None),
                }
            )
    schema = pa.schema(
        [
            ("run", pa.string()),
            ("server_config", pa.string()),
            ("engine", pa.string()),
            ("status", pa.string()),
            ("error", pa.string()),
            ("knobs", pa.string()),
            ("effective", pa.string()),
            ("server_info", pa.string()),
            ("ready_after_s", pa.float64()),
            ("adaptive", pa.string()),  # SGLang --speculative-adaptive: its candidate table (JSON), else null
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def open_runs(run_dirs: list[Path]) -> Opened:
    """Load every run (one-line errors for a bad one) and register its tables with a fresh DuckDB connection."""
    import duckdb

    runs = [load_run(d) for d in run_dirs]
    names = _names(runs)
    warnings = [f"{n}: {w}" for r, n in zip(runs, names, strict=False) for w in r.warnings]
    con = duckdb.connect(
        config={
            "memory_limit": MEMORY_LIMIT,
            "temp_directory": tempfile.gettempdir(),
            "preserve_insertion_order": False,
        }
    )  # ORDER BY orders; scans need not buffer
    con.execute("SET enable_progress_bar = false")  # rig prints the answer, nothing else
    tables = []
    for table, kind in FILE_TABLES.items():
        selects = []
        for run, name in zip(runs, names, strict=False):
            files = _readable(part_paths(run.run_dir / kind), warnings)
            if files:
                listing = "[" + ", ".join(_sql_str(f) for f in files) + "]"
                # the run's name first; the records' own columns after (union_by_name: older runs lack newer columns)
                selects.append(f"SELECT {_sql_str(name)} AS run, * FROM read_parquet({listing}, union_by_name = true)")
        if selects:
            con.execute(f"CREATE VIEW {table} AS " + " UNION ALL BY NAME ".join(selects))
            tables.append(table)
    for table, data in (("points", points_table(runs, names)), ("server_configs", server_configs_table(runs, names))):
        con.register(f"_{table}", data)
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM _{table}")
        tables.append(table)
    runs_t = pa.table(
        {
            "run": names,
            "run_dir": [str(r.run_dir) for r in runs],
            "status": pa.array([r.status for r in runs], pa.string()),
            "points": pa.array([len(r.points) for r in runs], pa.int64()),
        }
    )
    con.register("_runs", runs_t)
    con.execute("CREATE VIEW runs AS SELECT * FROM _runs")
    tables.append("runs")
    return Opened(con, warnings, tables)


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


def run_query(opened: Opened, sql: str, limit: int | None = None) -> tuple[pa.Table, bool]:
    """The query's first ``limit`` rows (all when None) as an Arrow table, and whether it has more."""
    import duckdb

    try:
        rel = opened.con.sql(sql)
        if rel is None:  # a statement, not a query: nothing to show
            return pa.table({}), False
        # DuckDB 1.4 renamed fetch_record_batch (kept, deprecated) to to_arrow_reader
        reader = rel.to_arrow_reader(10_000) if hasattr(rel, "to_arrow_reader") else rel.fetch_record_batch(10_000)
        batches, rows = [], 0
        for batch in reader:
            batches.append(batch)
            rows += batch.num_rows
            if limit is not None and rows > limit:
                break
    except duckdb.Error as e:
        raise QueryError(_one_line(e, opened)) from None
    table = pa.Table.from_batches(batches, schema=reader.schema)
    if limit is not None and table.num_rows > limit:
        return table.slice(0, limit), True
    return table, False


def write_query(opened: Opened, sql: str, out: Path) -> int:
    """Stream the query's result into ``out`` (.parquet or .csv) with DuckDB's COPY; returns the rows written."""
    import duckdb

    fmt = {".parquet": "PARQUET", ".csv": "CSV, HEADER"}.get(out.suffix.lower())
    if fmt is None:
        raise AnalysisInputError(f"-o {out}: the output must end in {' or '.join(OUTPUT_SUFFIXES)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        got = opened.con.execute(f"COPY ({sql.strip().rstrip(';')}) TO {_sql_str(str(out))} (FORMAT {fmt})")
        row = got.fetchone()
    except duckdb.Error as e:
        raise QueryError(_one_line(e, opened)) from None
    return int(row[0]) if row else 0


# --- the command ----------------------------------------------------------------------------------------------------


def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.6g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


@click.command("query")
@click.argument("sql")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write every row of the result to FILE.parquet or FILE.csv instead of printing a table.",
)
@click.option(
    "--limit",
    type=click.IntRange(1),
    default=100,
    show_default=True,
    help="Rows the terminal table shows (-o writes all of them).",
)
def query(sql: str, runs: tuple[Path, ...], output: Path | None, limit: int) -> None:
    """Answer a question in SQL over one or several runs (DuckDB). Tables: requests, server_metrics, gpu_metrics
    (where recorded), points, server_configs, runs; each has a ``run`` column. Example:

    rig query "SELECT point, quantile_cont(ttft_s, 0.99) AS ttft_p99 FROM requests WHERE ok GROUP BY point" RUN
    """
    from rich.console import Console
    from rich.table import Table

    from rig.analysis.cli import InputError

    err = Console(stderr=True)
    try:
        opened = open_runs(list(runs))
        for w in opened.warnings:
            err.print(f"[yellow]! {w}[/yellow]")
        if output is not None:
            n = write_query(opened, sql, output)
            err.print(f"wrote {n:,} row(s) to {output}")
            return
        table, more = run_query(opened, sql, limit)
    except (AnalysisInputError, QueryError) as e:
        raise InputError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    except OSError as e:
        raise click.ClickException(str(e).splitlines()[0]) from None
    t = Table(header_style="bold")
    for f in table.schema:
        numeric = pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type)
        t.add_column(f.name, justify="right" if numeric else "left", overflow="fold")
    for row in table.to_pylist():
        t.add_row(*(_cell(v) for v in row.values()))
    Console(width=None if Console().is_terminal else 200).print(t)
    if more:
        err.print(f"first {limit:,} rows shown (--limit N for more, -o FILE.parquet|FILE.csv for every row)")
