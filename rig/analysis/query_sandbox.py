"""``rig query`` reads the runs named and nothing else: DuckDB's own settings lock the connection down.

Once the runs' tables are registered, ``lock_down`` turns off DuckDB's access to the outside world
(``enable_external_access=false``: no other file, no URL, no ATTACH of a database file, no INSTALL/LOAD of an
extension) except the runs' part files themselves (``allowed_paths``, exact files) and a private spill directory,
turns off extension autoinstall/autoload, and locks the configuration so a query cannot turn any of it back on.

``allowed_paths`` lets DuckDB write the files it may read (``COPY (...) TO 'RUN/requests/.../part-00000.parquet'
(USE_TMP_FILE false)`` overwrote a part file on DuckDB 2.0.1), so ``read_only`` also asks DuckDB's own parser
what each statement is and runs only queries (SELECT; not EXPLAIN, whose ANALYZE runs what it explains, a COPY
too): no SQL text is matched.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from rig.results import MANIFEST

if TYPE_CHECKING:
    import duckdb

# Settings applied in this order: allowed_paths cannot change once external access is off, nothing once locked.
LOCKED_OFF = (
    "enable_external_access",
    "autoinstall_known_extensions",
    "autoload_known_extensions",
    "allow_community_extensions",
    "python_enable_replacements",  # a Python variable of the caller's frame is not a table either
)


class QueryRefused(Exception):
    """The query tried something ``rig query`` does not do (write, read another file, load an extension)."""


def spill_directory() -> Path:
    """A fresh private directory for DuckDB's spills (DuckDB may always write its temp directory: never /tmp)."""
    return Path(tempfile.mkdtemp(prefix="rig-query-"))


def remove_spill_directory(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _sql_list(items: list[str]) -> str:
    return "[" + ", ".join("'" + s.replace("'", "''") + "'" for s in items) + "]"


def lock_down(con: duckdb.DuckDBPyConnection, files: list[str]) -> None:
    """Allow reads of ``files`` only, switch off external access and extension loading, and lock the settings."""
    if files:
        con.execute(f"SET allowed_paths = {_sql_list(files)}")
    for name in LOCKED_OFF:
        con.execute(f"SET {name} = false")
    con.execute("SET lock_configuration = true")


def read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Raise QueryRefused unless every statement of ``sql`` is a SELECT (DuckDB's parser decides, not a pattern)."""
    import duckdb

    # SELECT alone: EXPLAIN ANALYZE runs the statement it explains (EXPLAIN ANALYZE COPY ... TO wrote a part file)
    for stmt in con.extract_statements(sql):
        if stmt.type != duckdb.StatementType.SELECT:
            kind = stmt.type.name
            raise QueryRefused(
                f"rig query only reads: statement type {kind} is refused, only SELECT runs (-o FILE writes a result)"
            )


def refuse_permission(message: str) -> str:
    """DuckDB's permission error as what it means here."""
    first = " ".join(message.split())
    return f"rig query reads only the runs named ({first})"


def output_clash(out: Path, run_dirs: list[Path]) -> str | None:
    """Why ``-o out`` would write into a run directory (a named one, or any with a manifest), or None."""
    target = out.expanduser().resolve()
    named = {d.expanduser().resolve() for d in run_dirs}
    for parent in target.parents:
        if parent in named or (parent / MANIFEST).is_file():
            return f"-o {out}: rig query does not write into run directory {parent} (write the result elsewhere)"
    return None
