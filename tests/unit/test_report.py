"""rig report end to end on hand-built runs: JSON, CSV, PNG, HTML, partial runs and one-line errors."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from synthetic import record, write_requests, write_run
from test_analysis import make_run

from rig.analysis.cli import report
from rig.analysis.report import build_report
from rig.analysis.tables import CAMPAIGN_KEYS, campaign_table, render_campaign_table

REQUIRED_KEYS = {
    "point",
    "steps",
    "workload",
    "concurrency",
    "rate",
    "aggregate_tok_s",
    "per_request_tok_s",
    "decode_tok_s",
    "tokens",
    "wall_s",
    "ok",
    "failed",
    "accept_length",
    "flags",
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("run"))


def _invoke(args: list[str]):
    return CliRunner().invoke(report, args)


def test_json_is_the_campaign_table(run_dir):
    r = _invoke([str(run_dir), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert rows == json.loads(json.dumps([row.to_dict() for row in campaign_table(run_dir)]))
    assert set(rows[0]) >= REQUIRED_KEYS and set(CAMPAIGN_KEYS) <= set(rows[0])
    assert rows[0]["aggregate_tok_s"] == pytest.approx(10.5)


def test_json_with_slo_adds_goodput(run_dir):
    r = _invoke([str(run_dir), "--json", "--slo", "ttft=800ms", "--slo", "tpot=250ms"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)[0]
    assert row["goodput_fraction"] == pytest.approx(1 / 3)


def test_terminal_report_has_every_section(run_dir):
    r = _invoke([str(run_dir), "--slo", "ttft=1s"])
    assert r.exit_code == 0, r.output
    for text in (
        "Aggregate tok/s",
        "Decode tok/s",
        "Latency",
        "Acceptance length",
        "Server vs client",
        "Goodput",
        "MISMATCH",
        "hb-DIFFERENT",
        "at running cap",
    ):
        assert text in r.output, text


def test_csv_plots_html(run_dir, tmp_path):
    html_file = tmp_path / "report.html"
    r = _invoke(
        [
            str(run_dir),
            "--csv",
            str(tmp_path / "csv"),
            "--plots",
            str(tmp_path / "plots"),
            "--html",
            str(html_file),
            "--slo",
            "e2e=3s",
        ]
    )
    assert r.exit_code == 0, r.output
    with open(tmp_path / "csv" / "campaign.csv") as f:
        rows = list(csv.DictReader(f))
    assert [row["point"] for row in rows] == ["p-s0", "p-s2", "p-s3", "p-s4"]
    assert float(rows[0]["wall_s"]) == pytest.approx(4.0)
    assert (tmp_path / "csv" / "lossless_mismatches.csv").read_text().count("\n") == 2
    assert (tmp_path / "csv" / "goodput.csv").exists()
    pngs = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert {
        "throughput_vs_concurrency.png",
        "request_speed_vs_concurrency.png",
        "acceptance_vs_steps.png",
        "latency_cdf_greedy_c2.png",
        "server_cfg4_greedy.png",
    } <= set(pngs)
    for p in (tmp_path / "plots").glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {p.with_suffix(".svg").name for p in (tmp_path / "plots").glob("*.png")} == {
        p.name for p in (tmp_path / "plots").glob("*.svg")
    }  # every figure in both formats
    page = html_file.read_text()
    # self-contained: the plots are inline SVG, whose only references are to their own definitions
    refs = re.findall(r'(?:src|href)\s*=\s*["\']([^"\']*)', page)
    assert refs and all(ref.startswith("#") for ref in refs)
    assert page.count("<svg") == len(pngs)
    assert "<link" not in page and "<script" not in page and "@import" not in page
    assert all(u.startswith("#") for u in re.findall(r"url\(([^)]*)\)", page))  # clip paths of the SVGs
    assert "hb-DIFFERENT" in page


def make_partial_run(d: Path) -> Path:
    """An interrupted run: a point with rows but a sparse manifest entry, one with no rows, one not in the manifest."""
    write_run(
        d,
        {
            "run_id": "part",
            "status": "interrupted",
            "points": [{"point": "p1"}, {"point": "p2", "status": "interrupted", "concurrency": 8}],
        },
    )
    common = dict(
        workload="greedy",
        steps=1,
        load_mode="closed",
        concurrency=4,
        repeat=0,
        server_config="c1",
        engine="sim",
        generator=0,
        ok=True,
        status="ok",
        completion_tokens=10,
    )
    write_requests(
        d, "p1", 0, [record(point="p1", request_id="x", send_ts=10.0, end_ts=12.0, ttft_s=0.5, e2e_s=2.0, **common)]
    )
    write_requests(
        d, "p3", 0, [record(point="p3", request_id="y", send_ts=20.0, end_ts=21.0, ttft_s=0.2, e2e_s=1.0, **common)]
    )
    (d / "requests" / "point=p1" / "gen=0" / "part-00001.parquet.tmp").write_bytes(b"PAR1 half-written")
    return d


def test_partial_run_reports_and_flags(tmp_path):
    d = make_partial_run(tmp_path / "run")
    rows = {r["point"]: r for r in campaign_table(d)}
    assert set(rows) == {"p1", "p2", "p3"}
    p1 = rows["p1"]
    assert (p1["workload"], p1["steps"], p1["concurrency"]) == ("greedy", 1, 4)  # filled from the rows
    assert p1["aggregate_tok_s"] == pytest.approx(5.0) and p1["wall_s"] == pytest.approx(2.0)
    assert "status_unknown" in p1["flags"]
    assert rows["p2"]["requests"] == 0 and rows["p2"]["aggregate_tok_s"] is None
    assert {"interrupted", "no_rows"} <= set(rows["p2"]["flags"])
    assert "not_in_manifest" in rows["p3"]["flags"]
    rep = build_report(d)
    assert any("interrupted" in w for w in rep.warnings)
    assert any("no rows" in w for w in rep.warnings)
    r = _invoke([str(d)])
    assert r.exit_code == 0, r.output
    assert "interrupted" in r.output and "no_rows" in r.output
    r = _invoke([str(d), "--html", str(tmp_path / "p.html"), "--plots", str(tmp_path / "pl")])
    assert r.exit_code == 0, r.output


def test_render_campaign_table_in_process(run_dir):
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(render_campaign_table(campaign_table(run_dir)))
    text = console.export_text()
    assert "greedy · cfg2 (sim, steps=2)" in text and "2.80" in text and "10.5" in text


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda d: None, "not a directory"),
        (lambda d: d.mkdir(), "not a rig run directory"),
        (lambda d: (d.mkdir(), (d / "manifest.json").write_text("{broken")), "not valid JSON"),
        (lambda d: write_run(d, {"run_id": "e", "status": "complete", "points": []}), "no points"),
    ],
)
def test_cli_errors_are_one_line(tmp_path, setup, message):
    d = tmp_path / "x"
    setup(d)
    for extra in ([], ["--json"]):
        r = _invoke([str(d), *extra])
        assert r.exit_code != 0
        assert isinstance(r.exception, SystemExit), r.exception
        out = r.output.strip()
        assert len(out.splitlines()) == 1 and out.startswith("Error:") and message in out, out


def test_bad_slo_is_a_usage_error(run_dir):
    r = _invoke([str(run_dir), "--slo", "latency=5"])
    assert r.exit_code == 2 and "Traceback" not in r.output
