"""The answer first: rig report's verdict (health, best per band with margin and CI, crossovers, the figure behind
them) on a hand-built run shaped like the reference campaign, whose answers are known."""

from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner
from golden import RUN as GOLDEN_RUN
from synthetic import campaign_run

from rig.analysis import metrics as m
from rig.analysis.cli import report as report_cmd
from rig.analysis.html import render_html
from rig.analysis.plots import DPI, draw_plot, plot_jobs, render_jobs, write_plots
from rig.analysis.report import build_report
from rig.analysis.verdict import verdict


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> Path:
    return campaign_run(tmp_path_factory.mktemp("campaign") / "run")


@pytest.fixture(scope="module")
def golden(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("golden") / "run"
    shutil.copytree(GOLDEN_RUN, d)
    return d


def test_best_per_band_and_the_crossover(campaign):
    v = verdict(build_report(campaign))
    [w] = v.workloads
    assert (w.workload, w.load_mode, w.objective) == ("greedy", "closed", "throughput")
    assert [(b.level, b.best) for b in w.bands] == [
        (1, "steps=4"),
        (4, "steps=4"),
        (16, "steps=4"),
        (32, "steps=4"),
        (64, "steps=3"),
    ]
    assert [(b.runner_up, b.decided) for b in w.bands] == [("steps=3", True)] * 4 + [("steps=2", True)]
    c1 = w.bands[0]
    # C=1: one request at a time, so aggregate tok/s is 200 tokens over each request's e2e (0.05 + 199 x TPOT)
    assert c1.margin == pytest.approx((0.05 + 199 * 0.0043) / (0.05 + 199 * 0.0036) - 1, abs=0.02)
    assert c1.ci_low is not None and c1.ci_high is not None and 0 < c1.ci_low < c1.margin < c1.ci_high
    [c] = w.crossovers
    assert (c.level, c.was, c.now, c.decided, c.incomplete) == (64, "steps=4", "steps=3", True, [])
    h = v.health
    assert (h.points, h.valid, h.flagged, h.failed, h.lossless, h.good) == (20, 20, {}, 0, "ok", True)
    assert h.requests == h.ok == 4 * (4 + 8 + 32 + 64 + 128)


def test_health_names_flagged_points_and_slos_narrow_the_bands(golden, campaign):
    h = verdict(build_report(golden)).health
    assert (h.points, h.valid, h.good) == (4, 3, False)
    assert h.flagged == {"client_saturated": ["sim-s4-01a61f00-realistic-c4"]}
    # p99 TPOT <= 25 ms: nothing meets it at C=64 (every setting's TPOT there is 29 ms or more)
    [w] = verdict(build_report(campaign, slos=[m.parse_slo("tpot=25ms")])).workloads
    assert [b.best for b in w.bands] == ["steps=4"] * 4 + [None]
    assert w.crossovers == [] and "meeting p99 tpot<=25ms" in w.among


def test_terminal_report_opens_with_the_verdict(campaign):
    r = CliRunner().invoke(report_cmd, [str(campaign)])
    assert r.exit_code == 0, r.output
    out = r.output
    assert out.index("Verdict") < out.index("health") < out.index("Concurrency")  # before the campaign table
    assert "from C=64: steps=3 " in out and "over steps=2 (95% CI +" in out
    assert "crossover: steps=4 → steps=3 at C=64" in out
    assert "20 point(s): 20 valid" in out and "944 ok, 0 failed, 0 cancelled" in out


def test_html_page_answer_first_then_collapsible_sections(campaign, tmp_path, monkeypatch):
    import rig.analysis.html as html_mod

    rep = build_report(campaign, slos=[m.parse_slo("tpot=25ms")], cdf_resolution=50)
    drawn: list[Path] = []

    def write_and_keep(*args, **kwargs):  # the plots the page drew, counted without drawing them twice
        drawn.extend(write_plots(*args, **kwargs))
        return drawn

    monkeypatch.setattr(html_mod, "write_plots", write_and_keep)
    page = render_html(rep)
    verdict_at, first_details = page.index('<section class="verdict">'), page.index("<details")
    assert verdict_at < first_details < page.index("Concurrency")
    head = page[verdict_at:first_details]
    assert head.count("<svg") == 1 and "from C=32: steps=4" in head  # the figure behind the verdict, inline
    assert "TPOT ≤ 25 ms" in head  # the SLO limit drawn (SVG text stays text)
    summaries = re.findall(r"<summary>([^<]*)</summary>", page)
    assert summaries[:3] == [
        "Campaign table",
        "Decisions: frontier, best per level, schedule",
        "Latency: percentiles and CDFs",
    ]
    assert "<details open><summary>Campaign table" in page and "<details><summary>Latency" in page
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    assert len(drawn) > 1 and page.count("<svg") == len(drawn)  # every plot drawn is inline


def test_png_plots_are_drawn_at_twice_their_layout_resolution(campaign, tmp_path):
    rep = build_report(campaign, cdf_resolution=20)
    plot, args, stem = plot_jobs(rep, tmp_path)[0]  # the verdict's figure comes first; the others are drawn alike
    assert stem.name == "verdict_greedy_closed"
    paths = render_jobs(rep, [(draw_plot, (plot, args, stem, ("png", "svg")))])[0]
    png = next(p for p in paths if p.name == "verdict_greedy_closed.png")
    width, height = struct.unpack(">II", png.read_bytes()[16:24])
    assert DPI == 220 and (width, height) == (round(5.6 * DPI), round(6.8 * DPI))
    assert (tmp_path / "verdict_greedy_closed.svg").read_text().lstrip().startswith("<?xml")
