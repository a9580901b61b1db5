"""Frontier, best configuration per load level and per SLO, on a hand-built run whose answers are known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from synthetic import record, write_requests, write_run

from rig.analysis import metrics as m
from rig.analysis.cli import report as report_cmd
from rig.analysis.report import build_report

N = 8  # requests per point
TOKENS = 101
TTFT = 0.05
# (steps, concurrency) -> TPOT in seconds. A point's requests run back to back in C slots, so
# aggregate tok/s = C x 101 / E2E and decode tok/s = 1 / TPOT.
TPOT = {(1, 1): 0.020, (1, 4): 0.030, (1, 8): 0.045, (3, 1): 0.010, (3, 4): 0.025, (3, 8): 0.060}


def _build(d: Path) -> Path:
    configs, points = {}, []
    for steps, c in TPOT:
        cfg, point = f"cfg{steps}", f"p-s{steps}-c{c}"
        configs[cfg] = {"engine": "sim", "knobs": {"engine": "sim", "tp": 4, "steps": steps}}
        points.append(
            {
                "point": point,
                "server_config": cfg,
                "engine": "sim",
                "workload": "realistic",
                "steps": steps,
                "load_mode": "closed",
                "concurrency": c,
                "rate": None,
                "repeat": 0,
                "status": "complete",
                "requests_scheduled": N,
                "records": {"ok": N, "failed": 0, "cancelled": 0},
                "flags": [],
                "generators": [{"generator": 0, "status": "complete"}],
            }
        )
    write_run(
        d,
        {
            "run_id": "fr",
            "status": "complete",
            "server_configs": configs,
            "points": points,
            "cluster": {"generators": [{"generator": 0, "clock_offset_s": 0.0}]},
        },
    )
    for (steps, c), tpot in TPOT.items():
        e2e = TTFT + tpot * (TOKENS - 1)
        rows = []
        for i in range(N):
            send = 100.0 + (i // c) * e2e
            rows.append(
                record(
                    run_id="fr",
                    point=f"p-s{steps}-c{c}",
                    engine="sim",
                    workload="realistic",
                    steps=steps,
                    server_config=f"cfg{steps}",
                    load_mode="closed",
                    concurrency=c,
                    repeat=0,
                    generator=0,
                    clock_offset_s=0.0,
                    request_id=f"r{i}",
                    send_ts=send,
                    first_token_ts=send + TTFT,
                    end_ts=send + e2e,
                    ttft_s=TTFT,
                    e2e_s=e2e,
                    completion_tokens=TOKENS,
                    status="ok",
                    ok=True,
                )
            )
        write_requests(d, f"p-s{steps}-c{c}", 0, rows)
    return d


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("frontier"))


def test_frontier_marks_exactly_the_undominated_points(run_dir):
    rep = build_report(run_dir)
    rows = {r["point"]: r for r in rep.campaign}
    e2e = TTFT + TPOT[(3, 1)] * 100
    assert rows["p-s3-c1"]["tok_s_per_gpu"] == pytest.approx(TOKENS / e2e / 4)
    assert rows["p-s3-c1"]["decode_tok_s"] == pytest.approx(100.0)
    # s3@1 (fast users), s3@4 and s1@8 (most tokens per GPU); s1@1 and s1@4 lose to s3@1 and s3@4 on both axes,
    # s3@8 to s3@4 (more tok/s per GPU and faster users).
    assert {p for p, r in rows.items() if r["on_frontier"]} == {"p-s3-c1", "p-s3-c4", "p-s1-c8"}
    assert [r["point"] for r in rep.frontier] == ["p-s3-c1", "p-s3-c4", "p-s1-c8"]


def test_best_per_level_and_per_slo(run_dir):
    rep = build_report(run_dir)
    best = {r["level"]: r for r in rep.best_per_level}
    assert (best[1]["best"], best[4]["best"], best[8]["best"]) == ("steps=3", "steps=3", "steps=1")
    assert best[1]["margin"] == pytest.approx((TOKENS / 1.05) / (TOKENS / 2.05) - 1)
    assert best[1]["paired_decode_speedup"] == pytest.approx(2.0) and best[1]["pairs"] == N
    # tpot <= 50 ms: steps=1 meets it at every level, steps=3 up to 4 -> steps=1 is best, capacity 8 vs 4.
    rep = build_report(run_dir, slos=[m.parse_slo("tpot=50ms")])
    [b] = rep.best_per_slo
    assert (b["best"], b["max_passing"], b["min_failing"], b["runner_up"], b["runner_up_max_passing"]) == (
        "steps=1",
        8,
        None,
        "steps=3",
        4,
    )
    assert b["capacity_margin"] == pytest.approx(1.0)
    levels = {r["level"]: r for r in rep.best_per_level}
    assert levels[8]["best"] == "steps=1" and levels[8]["runner_up"] is None  # steps=3 misses the SLO there
    # tpot <= 28 ms: steps=3 holds it to 4, steps=1 only at 1 -> steps=3, failing first at 8.
    [b] = build_report(run_dir, slos=[m.parse_slo("tpot=28ms")]).best_per_slo
    assert (b["best"], b["max_passing"], b["min_failing"], b["runner_up_max_passing"]) == ("steps=3", 4, 8, 1)
    # Nothing meets 5 ms.
    [b] = build_report(run_dir, slos=[m.parse_slo("tpot=5ms")]).best_per_slo
    assert b["best"] is None and b["max_passing"] is None


def test_report_outputs_carry_the_frontier_and_decisions(run_dir, tmp_path):
    r = CliRunner().invoke(report_cmd, [str(run_dir), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert {x["point"] for x in rows if x["on_frontier"]} == {"p-s3-c1", "p-s3-c4", "p-s1-c8"}
    r = CliRunner().invoke(report_cmd, [str(run_dir), "--json-full", "--slo", "tpot=50ms", "--slo-percentile", "90"])
    assert r.exit_code == 0, r.output
    full = json.loads(r.output)
    assert full["best_per_slo"][0]["best"] == "steps=1" and full["slo_percentile"] == 90
    assert {x["point"]: x["slo_meets"] for x in full["campaign"]}["p-s3-c8"] is False
    r = CliRunner().invoke(
        report_cmd,
        [str(run_dir), "--slo", "tpot=50ms", "--plots", str(tmp_path / "png"), "--html", str(tmp_path / "r.html")],
    )
    assert r.exit_code == 0, r.output
    assert "Pareto frontier" in r.output and "Best configuration under p99 tpot<=50ms" in r.output
    assert (tmp_path / "png" / "frontier_realistic.png").stat().st_size > 1000
    page = (tmp_path / "r.html").read_text()
    assert "Pareto frontier" in page and "Best configuration under p99 tpot&lt;=50ms" in page
