"""The time-resolved analysis of a load profile's point: windows from synthetic records and gauges, steady state with
ramp-up and drain excluded, and the time to adapt after each change."""

import json

import numpy as np
import pytest
from rich.console import Console
from synthetic import point_entry, record, write_requests, write_run, write_server_metrics

from rig.analysis.html import page_html
from rig.analysis.render import render_report
from rig.analysis.report import build_report, full_json
from rig.analysis.runs import load_run
from rig.analysis.timeline import Events, Samples, settle_time, summarize_phases, timeline
from rig.analysis.timeline_data import point_timeline
from rig.contracts.profile import parse_profile, schedule

START = 1000.0  # the point's start_wall
PHASES = schedule(parse_profile("1:10s,4:10s", "concurrency"))


def _requests() -> list[dict]:
    """Phase 0: one stream, a request each second; phase 1: four. Each request: 10 one-token chunks within its
    second, 5 verify calls in phase 0 (accept 2.0), 4 in phase 1 (accept 2.5)."""
    rows = []
    for t in range(20):
        for k in range(1 if t < 10 else 4):
            rows.append(
                record(
                    run_id="r",
                    point="p",
                    request_id=f"r{t}-{k}",
                    status="ok",
                    ok=True,
                    phase=0 if t < 10 else 1,
                    clock_offset_s=0.0,
                    send_ts=START + t,
                    first_token_ts=START + t + 0.05,
                    end_ts=START + t + 0.95,
                    ttft_s=0.05,
                    e2e_s=0.95,
                    completion_tokens=10,
                    spec_verify_ct=5 if t < 10 else 4,
                    chunk_offsets_s=[0.05 + 0.1 * i for i in range(10)],
                    chunk_tokens=[1] * 10,
                )
            )
    return rows


def _gauges() -> list[dict]:
    """Running requests 1, then 2, 3, 4 in the half seconds after the change; active steps 3, then 1 from 12 s."""
    out = []
    for i in range(41):
        t = i * 0.5
        running = 1.0 if t < 10 else min(4.0, 1.0 + (t - 10) / 0.5 + 1)
        out.append({"ts": START + t, "name": "sglang:num_running_reqs", "value": running})
        out.append({"ts": START + t, "name": "sglang:spec_num_steps", "value": 3.0 if t < 12 else 1.0})
    return out


@pytest.fixture
def run_dir(tmp_path):
    phases = [p.model_dump() for p in PHASES]
    entry = point_entry("p", steps=3, concurrency=4, start_wall=START, phases=phases)
    d = write_run(tmp_path / "run", {"run_id": "r", "status": "complete", "points": [entry]})
    write_requests(d, "p", 0, _requests())
    write_server_metrics(d, "p", _gauges())
    return d


def test_windows_count_tokens_by_chunk_time_and_carry_each_phase_and_gauge(run_dir):
    run = load_run(run_dir)
    tl = point_timeline(run, run.points[0], window_s=5.0)
    assert [w.start_s for w in tl.windows] == [0, 5, 10, 15]
    assert [w.phase for w in tl.windows] == [0, 0, 1, 1]
    assert [w.output_tok_s for w in tl.windows] == pytest.approx([10, 10, 40, 40])
    assert [w.sends for w in tl.windows] == [5, 5, 20, 20]
    assert [w.accept_length for w in tl.windows] == pytest.approx([2.0, 2.0, 2.5, 2.5])
    assert [w.ttft_p50_s for w in tl.windows] == pytest.approx([0.05] * 4)
    assert tl.windows[0].running == 1.0 and tl.windows[0].spec_steps == 3.0 and tl.windows[3].spec_steps == 1.0
    assert tl.windows[0].power_w is None and "no power_w samples" in tl.notes


def test_each_phase_excludes_its_ramp_up_and_the_drain_and_says_how_long_it_took_to_adapt(run_dir):
    run = load_run(run_dir)
    first, second = point_timeline(run, run.points[0], window_s=5.0).phases
    # running requests 2, 3, 4 from 10 s are within one of 4 at 10.5 s, but the active steps settle at 12 s
    assert second.steady_from_s == pytest.approx(12.0) and "active steps settled" in second.excluded
    assert second.steady_to_s == pytest.approx(19.0) and "drain from 19.0s" in second.excluded  # the last send
    assert second.output_tok_s == pytest.approx(40.0) and second.accept_length == pytest.approx(2.5)
    assert second.running == pytest.approx(4.0) and second.spec_steps == pytest.approx(1.0)
    assert second.steps_adapt_s == pytest.approx(2.0)  # the steps gauge reached 1 at 12 s and stayed
    assert second.tok_s_adapt_s == pytest.approx(0.0)
    assert first.steps_adapt_s is None and first.tok_s_adapt_s is None  # no change into the first phase
    assert first.output_tok_s == pytest.approx(10.0) and first.spec_steps == pytest.approx(3.0)


def test_the_report_shows_the_timeline_in_json_full_and_the_api(run_dir):
    from rig.api import open_run

    rep = build_report(run_dir, timeline_window_s=10.0)
    out = json.loads(json.dumps(full_json(rep)["timeline"]))
    assert out[0]["point"] == "p" and len(out[0]["windows"]) == 2 and len(out[0]["phases"]) == 2
    phases = open_run(run_dir).section("timeline_phases")
    assert list(phases.phase) == [0, 1] and phases.steps_adapt_s.iloc[1] == pytest.approx(2.0)
    assert "Load profile: steady state per phase" in page_html(rep, [])
    console = Console(width=250, record=True)
    console.print(render_report(rep))
    shown = console.export_text()
    assert "Load profile · p" in shown and "Timeline · p (10 s windows)" in shown and "drain from 19.0s" in shown


def test_a_point_without_a_profile_has_no_timeline(tmp_path):
    d = write_run(tmp_path / "run", {"run_id": "r", "status": "complete", "points": [point_entry("p", steps=3)]})
    assert "timeline" not in full_json(build_report(d))


def test_settle_time_on_a_synthetic_gauge():
    t = np.arange(0.0, 30.0, 1.0)
    steps = np.where(t < 13, 4.0, 2.0)
    assert settle_time(t, steps, 10.0, 30.0, 0.5, 0.0) == 3.0
    flat = np.full(t.size, 4.0)
    assert settle_time(t, flat, 10.0, 30.0, 0.5, 0.0, carry=True) == 0.0  # already there: nothing to adapt
    flapping = np.where(t % 2 == 0, 1.0, 7.0)
    assert settle_time(t, flapping, 10.0, 30.0, 0.5, 0.0) is None
    assert settle_time(t, steps, 40.0, 50.0, 0.5, 0.0) is None  # no samples


def test_without_a_running_gauge_the_first_window_is_dropped_and_a_ramp_is_not_called_steady():
    phases = schedule(parse_profile("2:20s,ramp(2,10,20s)", "rate"))
    send = np.arange(0.0, 40.0, 0.5)
    ev = Events(
        send=send,
        first=send + 0.1,
        end=send + 0.4,
        ttft=np.full(send.size, 0.1),
        tpot=np.full(send.size, 0.01),
        tokens=np.full(send.size, 8.0),
        verify=np.full(send.size, np.nan),
        chunk_t=send + 0.4,
        chunk_n=np.full(send.size, 8.0),
    )
    none = {"running": Samples.none(), "spec_steps": Samples.none(), "power_w": Samples.none()}
    steady, ramp = summarize_phases(ev, phases, none, 5.0)
    assert (steady.steady_from_s, steady.steady_to_s) == (5.0, 20.0) and "no running gauge" in steady.excluded
    assert steady.output_tok_s == pytest.approx(16.0) and steady.accept_length is None
    assert ramp.steady_from_s == 20.0 and "a ramp has no steady state" in ramp.excluded
    assert ramp.steps_adapt_s is None  # no steps gauge
    with pytest.raises(ValueError, match="window"):
        timeline("p", ev, phases, none, window_s=0)
