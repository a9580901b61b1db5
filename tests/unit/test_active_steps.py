"""The steps an adaptive server actually ran over a point: time-weighted from its spec_num_steps gauge, with
acceptance and throughput by tier over the scrape windows wholly in one tier."""

from __future__ import annotations

from rig.analysis.render import render_report
from rig.analysis.report import build_report, full_json
from tests.synthetic import greedy_rows, point_entry, write_requests, write_run, write_server_metrics

STEPS = [3, 3, 3, 3, 1, 1, 1, 1, 1, 3, 3]  # one scrape a second from t=100
TABLE = {"slots": {"1": [1, 3, 5, 7], "8": [0, 1, 3]}, "startup_steps": 3, "source": "SGLang 0.5.23 default table"}


def _samples() -> list[dict]:
    out, gen, verify = [], 0.0, 0.0
    for i, steps in enumerate(STEPS):
        ts = 100.0 + i
        out += [
            {"ts": ts, "name": "sglang:spec_num_steps", "value": float(steps)},
            {"ts": ts, "name": "sglang:generation_tokens_total", "value": gen},
            {"ts": ts, "name": "sglang:spec_verify_calls_total", "value": verify},
        ]
        nxt = STEPS[i + 1] if i + 1 < len(STEPS) else steps
        # the next second: 100 verifies at 3 tokens each in tier 3, 1.5 in tier 1, 2 across a switch
        gen += 300.0 if steps == nxt == 3 else 150.0 if steps == nxt == 1 else 200.0
        verify += 100.0
    return out


def _run(tmp_path, adaptive: bool):
    entry = {"engine": "sglang", **({"adaptive": TABLE} if adaptive else {})}
    manifest = {
        "run_id": "a",
        "status": "complete",
        "server_configs": {"cfg3": entry},
        "points": [point_entry("p3", 3)],
    }
    run_dir = write_run(tmp_path / "run", manifest)
    write_requests(run_dir, "p3", 0, greedy_rows("p3", 3, [0.05] * 4, [1.0] * 4, 100))
    write_server_metrics(run_dir, "p3", _samples())
    return run_dir


def test_active_steps_over_time_and_by_tier(tmp_path):
    rep = build_report(_run(tmp_path, adaptive=True))
    [row] = rep.active_steps
    assert row["adaptive"] == "1:[1,3,5,7] 8:[0,1,3]" and row["startup_steps"] == 3
    # 3 for 5 s, 1 for 5 s: the time-weighted mean is 2.0 (the samples' mean would be 2.27)
    assert (row["mean"], row["min"], row["max"], row["switches"], row["mixed_windows"]) == (2.0, 1, 3, 2, 2)
    tiers = {t["tier"]: t for t in row["tiers"]}
    assert (tiers[1]["seconds"], tiers[1]["share"], tiers[1]["windows"]) == (5.0, 0.5, 4)
    assert (tiers[1]["accept_length"], tiers[1]["gen_tok_s"]) == (1.5, 150.0)
    assert (tiers[3]["accept_length"], tiers[3]["gen_tok_s"], tiers[3]["windows"]) == (3.0, 300.0, 4)
    assert full_json(rep)["active_steps"] == rep.active_steps


def test_report_shows_it_with_the_accept_rate_note(tmp_path):
    from rich.console import Console

    console = Console(width=250, record=True)
    console.print(render_report(build_report(_run(tmp_path, adaptive=True))))
    text = console.export_text()
    assert "Active speculative steps per point" in text and "Acceptance and throughput by active tier" in text
    assert "spec_accept_rate divides by the startup draft count" in text
    assert "1: 50% · 3: 50%" in text
    assert "(sim, adaptive, start steps=3)" in text  # the campaign table's title: not fixed steps=3


def test_a_fixed_point_whose_steps_moved_is_shown_too(tmp_path):
    rep = build_report(_run(tmp_path, adaptive=False))
    assert "active_steps" in full_json(rep)  # labelled fixed steps=3, yet the gauge read 1 for half the point


def test_html_page_carries_both_sections(tmp_path):
    from rig.analysis.html import adaptive_html

    page = "".join(adaptive_html(build_report(_run(tmp_path, adaptive=True))))
    assert "Active speculative steps per point" in page and "Acceptance and throughput by active tier" in page
