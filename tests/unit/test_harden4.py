"""Hardening round 4 (issue 32), items 5 and 6: each case here failed on the tree before its fix."""

from __future__ import annotations

import pytest
from test_harden3 import _requests

from rig.analysis import metrics as m


# --- 5. goodput counts cancelled requests as misses
def test_goodput_counts_requests_cancelled_once_sent_as_missing_the_slo():
    # 26 served within 1 s; 174 cancelled at the level's end after running 4.9-5.2 s; 3 never sent (ran 0 s)
    r = _requests([1.0] * 26, [4.9, 5.0, 5.2] * 58 + [0.0] * 3)
    g = m.goodput(r, [m.parse_slo("e2e=2s")], wall_s=10.0)
    assert (g["good"], g["counted"]) == (26, 200)  # it was 26 of 26 (100 %) beside '177 cancelled left out'
    assert g["fraction"] == pytest.approx(0.13)
    assert g["goodput_req_s"] == pytest.approx(2.6)


# --- 5. the greedy losslessness check says "not checked" when it compared nothing
def test_losslessness_with_no_temperature_0_request_is_not_checked_not_ok():
    from rich.console import Console

    from rig.analysis.render import render_lossless
    from rig.contracts.report import LosslessResult

    nothing = LosslessResult.make(groups_checked=2, requests_checked=0, mismatches=[], ok=True)
    console = Console(width=200, record=True)
    console.print(render_lossless(nothing))
    text = console.export_text()
    assert text.startswith("Greedy losslessness: not checked (no temperature-0 request in the 2 group(s)"), text
    assert "OK" not in text


def test_losslessness_not_checked_in_the_html_and_the_verdict(monkeypatch):
    from rig.analysis import verdict
    from rig.analysis.html import lossless_html
    from rig.contracts.report import LosslessResult

    class _Report:
        lossless = LosslessResult.make(groups_checked=1, requests_checked=0, mismatches=[], ok=True)
        campaign: list = []

    [line] = lossless_html(_Report())  # type: ignore[arg-type]
    assert "Not checked" in line and "OK" not in line
    h = verdict.health(_Report())  # type: ignore[arg-type]
    assert verdict.health_text(h)[1].endswith("greedy losslessness: not checked (no temperature-0 requests)")
