"""rig query (issue 24): SQL over one or several runs, printed or written as Parquet / CSV; bad SQL is one line."""

from __future__ import annotations

import csv
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from synthetic import point_entry, record, write_requests, write_run, write_server_metrics

from rig.analysis.query import query


def _point(point: str, steps: int) -> dict:
    return point_entry(point, steps, concurrency=2)


def make_run(d: Path, run_id: str, n: dict[str, int]) -> Path:
    """Points p0 (steps 0) and p2 (steps 2) with ``n[point]`` ok requests of 10 tokens and one failed request each."""
    write_run(
        d,
        {
            "run_id": run_id,
            "status": "complete",
            "points": [_point("p0", 0), _point("p2", 2)],
            "server_configs": {
                "cfg0": {"engine": "sim", "knobs": {"steps": 0, "tp": 4}},
                "cfg2": {"engine": "sim", "knobs": {"steps": 2, "tp": 4}},
            },
        },
    )
    for point, steps in (("p0", 0), ("p2", 2)):
        rows = [
            record(
                point=point,
                steps=steps,
                request_id=f"r{i}",
                ok=True,
                status="ok",
                completion_tokens=10,
                ttft_s=0.1 * (i + 1),
                e2e_s=1.0,
                send_ts=100.0 + i,
                end_ts=101.0 + i,
                generator=0,
            )
            for i in range(n[point])
        ]
        rows.append(
            record(
                point=point,
                steps=steps,
                request_id="bad",
                ok=False,
                status="failed",
                error="HTTP 500",
                generator=0,
                send_ts=100.0,
            )
        )
        write_requests(d, point, 0, rows)
        write_server_metrics(
            d, point, [{"ts": 100.0 + k, "name": "sglang:num_running_reqs", "value": float(k)} for k in range(3)]
        )
    return d


@pytest.fixture()
def runs(tmp_path):
    return (
        make_run(tmp_path / "a", "run-a", {"p0": 3, "p2": 5}),
        make_run(tmp_path / "b", "run-b", {"p0": 4, "p2": 2}),
    )


def test_sql_over_two_runs_to_csv_and_parquet(runs, tmp_path):
    a, b = runs
    sql = (
        "SELECT r.run, p.steps, count(*) AS n, sum(r.completion_tokens) AS tokens "
        "FROM requests r JOIN points p USING (run, point) WHERE r.ok GROUP BY ALL ORDER BY r.run, p.steps"
    )
    out = tmp_path / "out" / "q.csv"
    res = CliRunner().invoke(query, [sql, str(a), str(b), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert [list(r.values()) for r in csv.DictReader(out.open())] == [
        ["run-a", "0", "3", "30"],
        ["run-a", "2", "5", "50"],
        ["run-b", "0", "4", "40"],
        ["run-b", "2", "2", "20"],
    ]
    assert out.read_text().splitlines()[0] == "run,steps,n,tokens"
    pq_out = tmp_path / "q.parquet"
    res = CliRunner().invoke(
        query,
        [
            "SELECT run, point, quantile_cont(ttft_s, 0.5) AS p50 FROM requests WHERE ok GROUP BY ALL ORDER BY ALL",
            str(a),
            "-o",
            str(pq_out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert pq.read_table(pq_out).to_pylist() == [
        {"run": "run-a", "point": "p0", "p50": pytest.approx(0.2)},
        {"run": "run-a", "point": "p2", "p50": pytest.approx(0.3)},
    ]


def test_manifest_tables_and_terminal_table(runs):
    a, _ = runs
    res = CliRunner().invoke(
        query,
        [
            "SELECT s.server_config, s.knobs->>'tp' AS tp, p.point, p.status, m.samples "
            "FROM server_configs s JOIN points p USING (run, server_config) JOIN "
            "(SELECT point, count(*) AS samples FROM server_metrics GROUP BY point) m "
            "USING (point) ORDER BY p.point",
            str(a),
        ],
    )
    assert res.exit_code == 0, res.output
    rows = [ln for ln in res.output.splitlines() if "│" in ln and "cfg" in ln]
    assert [[c.strip() for c in ln.split("│")[1:-1]] for ln in rows] == [
        ["cfg0", "4", "p0", "complete", "3"],
        ["cfg2", "4", "p2", "complete", "3"],
    ]
    res = CliRunner().invoke(query, ["SELECT * FROM requests", str(a), "--limit", "2"])
    assert res.exit_code == 0 and "first 2 rows shown" in res.output


def test_gpu_metrics_when_recorded_and_a_clear_line_when_not(runs):
    a, b = runs
    res = CliRunner().invoke(query, ["SELECT avg(power_w) FROM gpu_metrics", str(a)])
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and "no gpu_metrics" in res.output and "NVML" in res.output
    gdir = a / "gpu_metrics" / "point=p0"
    gdir.mkdir(parents=True)
    pq.write_table(
        pa.table({"point": ["p0"] * 2, "ts": [1.0, 2.0], "gpu": [0, 1], "power_w": [300.0, 500.0]}),
        gdir / "part-00000.parquet",
    )
    res = CliRunner().invoke(query, ["SELECT run, avg(power_w) AS w FROM gpu_metrics GROUP BY run", str(a), str(b)])
    assert res.exit_code == 0, res.output
    assert "run-a" in res.output and "400" in res.output


@pytest.mark.parametrize("sql", ["SELEC 1", "SELECT nope FROM requests", "SELECT * FROM missing_table"])
def test_bad_sql_is_one_line_exit_2(runs, sql):
    res = CliRunner().invoke(query, [sql, str(runs[0])])
    assert res.exit_code == 2
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert len(res.output.strip().splitlines()) == 1 and res.output.startswith("Error:"), res.output


def test_bad_inputs_exit_2(runs, tmp_path):
    for args in (["SELECT 1", str(tmp_path / "nope")], ["SELECT 1", str(runs[0]), "-o", str(tmp_path / "x.txt")]):
        res = CliRunner().invoke(query, args)
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output


def test_unreadable_part_is_skipped_with_a_warning(runs):
    a, _ = runs
    bad = a / "requests" / "point=p0" / "gen=0" / "part-00099.parquet"
    bad.write_bytes(b"PAR1 cut short")
    res = CliRunner().invoke(query, ["SELECT count(*) AS n FROM requests", str(a)])
    assert res.exit_code == 0, res.output
    assert "unreadable part file skipped" in res.output
    assert [ln.strip("│ ") for ln in res.output.splitlines() if "│" in ln][-1] == "10"  # 3 + 5 ok, 1 failed each
