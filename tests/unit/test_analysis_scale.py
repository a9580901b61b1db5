"""The report at scale (issue 24): the same numbers from cheaper paths (ITL masked in numpy, percentiles by selection,
a read-ahead thread, one read per point), warnings in the order a single pass adds them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from synthetic import record, write_requests, write_run

from rig.analysis import metrics as m
from rig.analysis.points import load_requests
from rig.analysis.report import build_report
from rig.analysis.runs import load_run


def test_itl_values_masks_rows_without_copying_lists():
    offsets = pa.array([[0.1, 0.3, 0.6], [0.1, 0.5], [0.2, 0.4], None, [1.0]], pa.list_(pa.float64()))
    tokens = pa.array([[1, 2, 3], [1, 1], None, [4], [1]], pa.list_(pa.int32()))
    ok = np.array([True, False, True, True, True])
    values, weights = m.itl_values(offsets, tokens, ok)
    # row 0: gaps 0.2 over 2 tokens, 0.3 over 3; row 1 is not ok; row 2 has no counts (1 token a chunk); rows 3, 4: none
    assert values == pytest.approx([0.1, 0.1, 0.2])
    assert weights.tolist() == [2.0, 3.0, 1.0]
    every = m.itl_values(offsets, tokens)
    assert every[0] == pytest.approx([0.1, 0.1, 0.4, 0.2])


@pytest.mark.parametrize("seed", range(20))
def test_percentiles_by_selection_equal_the_sorted_path(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    v = np.round(rng.gamma(2.0, 0.01, n), int(rng.integers(2, 6)))  # ties too
    w = rng.integers(0, 5, n).astype(float)
    v[rng.random(n) < 0.05] = np.nan
    sv, sw = m.sort_weighted(v, w)
    qs = list(m.PERCENTILES) + [0, 100]
    assert m.weighted_percentiles(v, w, qs) == m.weighted_percentiles(sv, sw, qs, presorted=True)
    if sw.size:
        assert m.weighted_percentiles(v, w, qs) == pytest.approx(list(np.percentile(np.repeat(sv, sw.astype(int)), qs)))


def _run(d: Path, points: int = 4, rows: int = 30) -> Path:
    pts = [
        {
            "point": f"p{i}",
            "server_config": f"c{i}",
            "engine": "sim",
            "workload": "greedy",
            "steps": i,
            "load_mode": "closed",
            "concurrency": 2,
            "repeat": 0,
            "status": "complete",
            "flags": [],
            "generators": [],
        }
        for i in range(points)
    ]
    write_run(d, {"run_id": "scale", "status": "complete", "points": pts})
    for i in range(points):
        write_requests(
            d,
            f"p{i}",
            0,
            [
                record(
                    point=f"p{i}",
                    steps=i,
                    request_id=f"r{k}",
                    ok=True,
                    status="ok",
                    completion_tokens=5,
                    ttft_s=0.1,
                    e2e_s=0.5,
                    send_ts=100.0 + k,
                    end_ts=100.5 + k,
                    generator=0,
                    temperature=0.0,
                    output_hash="h",
                    chunk_offsets_s=[0.1, 0.2, 0.5],
                    chunk_tokens=[1, 2, 2],
                )
                for k in range(rows)
            ],
        )
    return d


def test_reader_thread_adds_warnings_in_point_order(tmp_path):
    d = _run(tmp_path / "run")
    for i in (3, 1):  # cut short: no footer
        (d / "requests" / f"point=p{i}" / "gen=0" / "part-00077.parquet").write_bytes(b"PAR1 cut")
    rep = build_report(d, cdf_resolution=0)
    skipped = [w for w in rep.run.warnings if w.startswith("unreadable part file skipped")]
    assert [w.split("point=")[1][:2] for w in skipped] == ["p1", "p3"]
    assert {r["point"]: "unreadable_parts" in r["flags"] for r in rep.campaign} == {
        "p0": False,
        "p1": True,
        "p2": False,
        "p3": True,
    }
    assert rep.cdfs == {}  # the terminal draws no CDF
    itl = next(r for r in rep.latency if r["point"] == "p0" and r["metric"] == "itl")
    # per request: 0.1 s over 2 tokens, 0.3 s over 2 tokens -> 0.05, 0.05, 0.15, 0.15 s; p50 between them
    assert itl["n"] == 30 * 4 and itl["p50_ms"] == pytest.approx(100.0) and itl["mean_ms"] == pytest.approx(100.0)
    assert build_report(d).cdfs["p0"]["itl"][0].size == 200


def test_a_point_is_read_again_when_its_files_change(tmp_path):
    d = _run(tmp_path / "run", points=1)
    run = load_run(d)
    assert load_requests(run, run.points[0]).n == 30
    assert load_requests(run, run.points[0]) is load_requests(run, run.points[0])  # kept: one read per point
    write_requests(d, "p0", 1, [record(point="p0", request_id="late", ok=True, status="ok", generator=1)])
    assert load_requests(run, run.points[0]).n == 31
