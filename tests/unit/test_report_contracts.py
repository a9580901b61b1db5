"""The report's typed rows (rig.contracts.report) and its column declarations (rig.analysis.columns)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rig.analysis import columns
from rig.analysis.energy import COST_KEYS, ENERGY_KEYS, PointEnergy
from rig.analysis.tables import CAMPAIGN_KEYS
from rig.contracts import (
    PROBE_SUMMARY_FIELDS,
    CampaignRow,
    ErrorCount,
    GoodputRow,
    Probe,
    ServerRow,
    SloCheck,
)


def _row(**over: object) -> CampaignRow:
    base: dict[str, object] = dict(
        point="p",
        server_config="cfg",
        engine="sim",
        steps=2,
        workload="greedy",
        load_mode="closed",
        concurrency=4,
        rate=None,
        achieved_rate=None,
        repeat=0,
        status="complete",
        requests=10,
        aggregate_tok_s=100.0,
        per_request_tok_s=25.0,
        decode_tok_s=30.0,
        tokens=1000,
        wall_s=10.0,
        first_send_ts=1.0,
        last_end_ts=11.0,
        ok=9,
        failed=1,
        cancelled=0,
        accept_length=None,
        accept_source=None,
        flags=["has_failures"],
        flag_reasons={"has_failures": "1 of 10 requests failed"},
        error=None,
        errors=[ErrorCount.make(status="failed", error="boom", count=1)],
    )
    base.update(over)
    return CampaignRow.make(**base)


def test_a_campaign_row_serialises_its_set_fields_in_declaration_order():
    r = _row()
    assert list(r.to_dict()) == list(CAMPAIGN_KEYS)
    assert r.to_dict()["errors"] == [{"status": "failed", "error": "boom", "count": 1}]
    # sections appear once set, each at its place whatever order they were set in
    r.usd_per_mtok = 1.5
    r.on_frontier = True
    r.goodput_fraction = 0.5
    keys = list(r.to_dict())
    assert keys[-3:] == ["goodput_fraction", "on_frontier", "usd_per_mtok"]
    assert "slo_meets" not in r and r.get("slo_meets") is None and r.get("nonsense", 7) == 7
    assert r["aggregate_tok_s"] == 100.0 and r.level == 4
    with pytest.raises(KeyError):
        r["nonsense"]
    json.dumps(r.to_dict())  # plain JSON


def test_make_neither_validates_nor_coerces():
    r = _row(rate=2, load_mode="poisson")
    assert r.rate == 2 and isinstance(r.rate, int)  # an int rate stays an int: the JSON reads '2', not '2.0'
    assert r.level == 2


def test_the_campaign_rows_sections_are_the_energy_modules_keys():
    fields = list(CampaignRow.model_fields)
    assert fields[: len(CAMPAIGN_KEYS)] == list(CAMPAIGN_KEYS)
    assert fields[-len(ENERGY_KEYS + COST_KEYS) :] == list(ENERGY_KEYS + COST_KEYS)
    assert tuple(f.name for f in dataclasses.fields(PointEnergy)) == ENERGY_KEYS


def test_a_probe_summary_is_what_the_search_records():
    check = SloCheck.make(slo="ttft<=500ms", metric="ttft", limit_s=0.5, value_s=0.25, margin=0.5, meets=True)
    p = Probe.make(
        point="p",
        steps=2,
        level=4,
        meets=True,
        margin=0.5,
        per_slo=[check],
        requests=10,
        aggregate_tok_s=100.0,
        decode_tok_s=30.0,
        accept_length=None,
        flags=[],
        valid=True,
        mean_ttft_s=0.2,
    )
    s = p.summary()
    assert tuple(s) == PROBE_SUMMARY_FIELDS
    assert s["per_slo"] == [
        {"slo": "ttft<=500ms", "metric": "ttft", "limit_s": 0.5, "value_s": 0.25, "margin": 0.5, "meets": True}
    ]
    assert p["meets"] is True and p.to_dict()["per_slo"] == s["per_slo"]


@pytest.mark.parametrize(
    ("declared", "model"),
    [(columns.CAMPAIGN, CampaignRow), (columns.SERVER, ServerRow), (columns.GOODPUT, GoodputRow)],
)
def test_every_declared_column_reads_a_field_of_its_rows(declared, model):
    assert {c.key for c in declared} <= set(model.model_fields)


def test_the_html_and_terminal_headers_come_from_one_declaration():
    from rig.analysis.html import LATENCY_COLS

    assert [h for _, h, _ in LATENCY_COLS] == [c.titled() for c in columns.LATENCY]
    assert [c.titled() for c in columns.LATENCY][-1] == "p99 (ms)"


def test_the_terminal_goodput_table_reads_the_column_declaration():
    """One declaration (rig.analysis.columns.GOODPUT) for the terminal and the HTML: the fraction as a percentage."""
    from rich.console import Console

    from rig.analysis.render import render_goodput
    from rig.contracts import GoodputRow

    rows = [
        GoodputRow.make(
            slos="ttft<=500ms",
            good=1,
            counted=8,
            fraction=0.125,
            goodput_req_s=0.5,
            goodput_tok_s=12.0,
            point="p1",
            steps=2,
            level=4,
        ),
        GoodputRow.make(
            slos="ttft<=500ms",
            good=0,
            counted=0,
            fraction=None,
            goodput_req_s=None,
            goodput_tok_s=None,
            point="p2",
            steps=2,
            level=8,
        ),
    ]
    console = Console(width=200, record=True, color_system=None)
    console.print(render_goodput(rows))
    text = console.export_text()
    assert "Goodput (ttft<=500ms)" in text and "Fraction" in text
    line1 = next(line for line in text.splitlines() if "p1" in line)
    line2 = next(line for line in text.splitlines() if "p2" in line)
    assert "12.5%" in line1 and "0.50" in line1 and "12.0" in line1
    assert "%" not in line2 and line2.count("–") == 3  # fraction, req/s and tok/s unknown
