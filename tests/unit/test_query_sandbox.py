"""rig query is read-only and local (issue 32, item 2): DuckDB's own settings, one line for what it refuses."""

from __future__ import annotations

import csv
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from test_query import make_run

from rig.analysis.query import query


@pytest.fixture()
def run(tmp_path):
    return make_run(tmp_path / "a", "run-a", {"p0": 3, "p2": 5})


def _part(run: Path) -> Path:
    return next((run / "requests" / "point=p0").rglob("part-*.parquet"))


def _refused(run: Path, sql: str, *extra: str) -> str:
    res = CliRunner().invoke(query, [sql, str(run), *extra])
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and res.output.startswith("Error:"), res.output
    return res.output


@pytest.mark.parametrize(
    "sql",
    [
        "COPY (SELECT 1) TO '{out}/x.csv'",
        # DuckDB lets a query write a file it may read: the statement itself is refused
        "COPY (SELECT 1 AS y) TO '{part}' (FORMAT parquet, USE_TMP_FILE false)",
        "COPY requests TO '{out}/requests.parquet'",
        # EXPLAIN ANALYZE runs what it explains: it overwrote the part file on 89e0365
        "EXPLAIN ANALYZE COPY (SELECT 1 AS y) TO '{part}' (FORMAT parquet, USE_TMP_FILE false)",
        "EXPORT DATABASE '{out}/db'",
        "ATTACH '{out}/x.duckdb' AS x",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SELECT 1; COPY (SELECT 1) TO '{out}/y.csv'",
        "SET enable_external_access = true",
        "CREATE TABLE t AS SELECT 1",
    ],
)
def test_writes_attach_and_extensions_are_refused(run, tmp_path, sql):
    part = _part(run)
    before = part.read_bytes()
    _refused(run, sql.format(out=tmp_path, part=part))
    assert part.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM glob('/etc/*')",
        "SELECT * FROM read_json('{manifest}')",  # not a part file: only the tables' files are readable
        "SELECT * FROM 'https://example.com/x.parquet'",
    ],
)
def test_reads_of_other_files_are_refused(run, sql):
    out = _refused(run, sql.format(manifest=run / "manifest.json"))
    assert "reads only the runs named" in out


def test_the_settings_are_locked(run):
    # no statement of a script runs when one of them is not a query (here: unlocking the settings)
    _refused(run, "SELECT * FROM read_csv('/etc/passwd'); SET lock_configuration = false")
    res = CliRunner().invoke(
        query,
        [
            "SELECT current_setting('enable_external_access') AS ext, current_setting('lock_configuration') AS locked,"
            " current_setting('autoinstall_known_extensions') AS inst,"
            " current_setting('autoload_known_extensions') AS load",
            str(run),
        ],
    )
    assert res.exit_code == 0, res.output
    row = [ln for ln in res.output.splitlines() if "│" in ln][-1]
    assert [c.strip() for c in row.split("│")[1:-1]] == ["False", "True", "False", "False"]


def test_output_into_a_run_directory_is_refused(run, tmp_path):
    for out in (run / "q.csv", run / "requests" / "q.parquet", run / "new" / "q.csv"):
        out_line = _refused(run, "SELECT 1 AS a", "-o", str(out))
        assert "run directory" in out_line and not out.exists()
    other = make_run(tmp_path / "b", "run-b", {"p0": 1, "p2": 1})  # a run not named is a run all the same
    _refused(run, "SELECT 1 AS a", "-o", str(other / "q.csv"))
    ok = tmp_path / "out" / "q.csv"
    res = CliRunner().invoke(query, ["SELECT 1 AS a, 'x,y' AS b", str(run), "-o", str(ok)])
    assert res.exit_code == 0, res.output
    assert list(csv.reader(ok.open())) == [["a", "b"], ["1", "x,y"]]


def test_duplicate_column_names_keep_their_values(run, tmp_path):
    res = CliRunner().invoke(query, ["SELECT 1 AS a, 2 AS a, 3 AS b", str(run)])
    assert res.exit_code == 0, res.output
    rows = [[c.strip() for c in ln.split("│")[1:-1]] for ln in res.output.splitlines() if "│" in ln]
    assert rows == [["1", "2", "3"]]
    out = tmp_path / "dup.csv"
    assert CliRunner().invoke(query, ["SELECT 1 AS a, 2 AS a", str(run), "-o", str(out)]).exit_code == 0
    assert list(csv.reader(out.open())) == [["a", "a"], ["1", "2"]]


def test_timestamps_and_intervals_print_as_such(run):
    res = CliRunner().invoke(
        query,
        [
            "SELECT TIMESTAMP '2026-12-02 14:05:06.5' AS t, to_timestamp(100) AS tz, DATE '2026-12-02' AS d,"
            " INTERVAL 3 SECOND AS i, INTERVAL 2 DAY AS j",
            str(run),
        ],
    )
    assert res.exit_code == 0, res.output
    row = [ln for ln in res.output.splitlines() if "│" in ln][-1]
    assert [c.strip() for c in row.split("│")[1:-1]] == [
        "2026-12-02 14:05:06.500000",
        "1970-01-01 00:01:40+00:00",
        "2026-12-02",
        "0:00:03",
        "2 days",
    ]


def test_warnings_once_on_stderr_and_summed_up(run):
    gen = _part(run).parent
    for k in range(6):
        (gen / f"part-0009{k}.parquet").write_bytes(b"PAR1 cut short")
    res = CliRunner().invoke(query, ["SELECT count(*) AS n FROM requests", str(run)])
    assert res.exit_code == 0, res.output
    assert "unreadable" not in res.stdout and res.stdout.strip().splitlines()[-2].strip("│ ") == "10"
    warned = res.stderr.splitlines()
    assert len(warned) == 4 and warned[-1].endswith("unreadable part file skipped: 3 more"), warned
    assert all(w.startswith("! ") for w in warned)


def test_spill_directory_is_private_and_removed(run, monkeypatch, tmp_path):
    import rig.analysis.query as q

    made: list[Path] = []
    real = q.spill_directory

    def spy() -> Path:
        made.append(real())
        return made[-1]

    monkeypatch.setattr(q, "spill_directory", spy)
    res = CliRunner().invoke(query, ["SELECT current_setting('temp_directory') AS t", str(run)])
    assert res.exit_code == 0, res.output
    assert made and str(made[0]) in res.output.replace("\n", "").replace("│", "").replace(" ", "")
    assert not made[0].exists()
    assert pq.read_metadata(_part(run)).num_rows == 4
