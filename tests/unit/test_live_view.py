"""The live view of rig run / rig sweep: figures computed on the driver from what it polls (the generators' counters
and fixed-size latency sketches, the server's last gauges); shown only on a terminal without -q."""

from __future__ import annotations

import io
import types

import numpy as np
import pytest
from rich.console import Console
from test_drive import drive, sessions

from rig.contracts import GeneratorProgress, LatencySketch, ServerGauges
from rig.contracts.live import SKETCH_BUCKETS
from rig.progress_ui import ProgressUI, live_panel
from rig.run import execute
from rig.run.live import LiveTracker
from rig.server.scrape import LastGauges, parse_metrics


def test_sketch_quantiles_are_within_its_resolution_and_merge_exactly():
    rng = np.random.default_rng(3)
    a, b = rng.lognormal(-3, 1, 5000), rng.lognormal(-1, 0.5, 3000)  # TTFT-like, seconds
    sa, sb, both = LatencySketch(), LatencySketch(), LatencySketch()
    for x in a:
        sa.add(float(x))
        both.add(float(x))
    for x in b:
        sb.add(float(x))
        both.add(float(x))
    sa.merge(sb)
    assert sa.counts == both.counts and sa.n == 8000 and len(sa.counts) == SKETCH_BUCKETS
    every = np.concatenate([a, b])
    for q in (0.5, 0.9, 0.99):
        exact = float(np.quantile(every, q, method="inverted_cdf"))
        assert sa.quantile(q) == pytest.approx(exact, rel=0.045)
    assert LatencySketch().quantile(0.5) is None
    s = LatencySketch()
    s.add(float("nan"))
    s.add(0.0)
    s.add(1e9)  # out of range both ways: first and last bucket, never an IndexError
    assert s.counts[0] == 2 and s.counts[-1] == 1


def test_tok_s_is_over_the_last_window_of_completed_tokens():
    t = LiveTracker(started=100.0, window_s=5.0)
    snap = None
    for i in range(21):  # polls every 0.5 s; 40 tokens complete per 0.5 s until t=105, then 400 per 0.5 s
        now = 100.0 + 0.5 * i
        tokens = 40 * min(i, 10) + 400 * max(0, i - 10)
        snap = t.update(now, GeneratorProgress({"tokens": tokens, "ok": i, "scheduled": 64}), None)
        if i == 1:
            assert snap.tok_s is None  # under a second of history: no rate yet
    assert snap is not None and snap.tok_s == pytest.approx(800.0)  # the last 5 s only: 4,000 tokens
    assert (snap.elapsed_s, snap.done, snap.scheduled) == (10.0, 20, 64)


METRICS = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{tp_rank="0",dp_rank="0"} 12.0
sglang:num_running_reqs{tp_rank="0",dp_rank="1"} 5.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{tp_rank="0",dp_rank="0"} 3.0
# TYPE sglang:spec_num_steps gauge
sglang:spec_num_steps{tp_rank="0",dp_rank="0"} 3.0
sglang:spec_num_steps{tp_rank="0",dp_rank="1"} 3.0
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{tp_rank="0",dp_rank="0"} 1500.5
# TYPE sglang:token_usage gauge
sglang:token_usage{tp_rank="0",dp_rank="0"} 0.4
"""


def test_server_gauges_from_a_scrape():
    g = LastGauges()
    assert g.answer(None) == ServerGauges()  # nothing scraped yet
    g.seen(parse_metrics(METRICS))
    got = g.answer(1234.0)
    # requests add up over DP ranks; every rank runs the same speculative steps
    assert (got.running, got.queued, got.spec_steps, got.gen_throughput, got.power_w) == (17, 3, 3, 1500.5, 1234.0)
    assert got.age_s is not None and got.age_s >= 0
    g.seen([])  # a scrape that failed keeps the last answer
    assert g.answer(None).running == 17


def test_a_generator_sketches_its_successful_requests(tmp_path):
    seen = {}
    drive(tmp_path, sessions=sessions(7, {3: "http500"}), slots=3, patch=lambda run: seen.setdefault("run", run))
    from rig.results import read_requests

    t = read_requests(tmp_path).to_pandas()
    ok = t[t.ok]
    p = seen["run"].progress()
    assert p.counts["ok"] == 6 and p.counts["failed"] == 1
    assert p.ttft.n == 6 and p.tpot.n == 6  # the failed request is not in the latencies
    median = float(np.quantile(ok.ttft_s, 0.5, method="inverted_cdf"))
    assert p.ttft.quantile(0.5) == pytest.approx(median, rel=0.045)
    tpot = (ok.e2e_s - ok.ttft_s) / (ok.completion_tokens - 1)
    assert p.tpot.quantile(1.0) == pytest.approx(float(tpot.max()), rel=0.045)
    p.ttft.add(1.0)  # a copy: the level's own sketch is not changed by its reader
    assert seen["run"].progress().ttft.n == 6


class _Remote:
    def __init__(self, answer):
        self.answer, self.calls = answer, 0

    def remote(self):
        self.calls += 1
        return self.answer


def _executor(monkeypatch, live: bool):
    gauges = ServerGauges(running=8, queued=2, spec_steps=4, power_w=900.0)
    handle = types.SimpleNamespace(live=_Remote(gauges))
    got: list = []
    progress = types.SimpleNamespace(live=live, point_update=lambda done, counts: None, point_live=got.append)
    sketch = LatencySketch()
    sketch.add(0.2)
    fleet = types.SimpleNamespace(
        poll_progress=lambda: GeneratorProgress({"ok": 3, "failed": 1, "in_flight": 4, "tokens": 300}, sketch)
    )
    monkeypatch.setattr(execute, "ray", types.SimpleNamespace(get=lambda ref, timeout=None: ref))
    ex = execute.PointExecutor(
        types.SimpleNamespace(progress=progress, fleet=fleet), types.SimpleNamespace(handle=handle)
    )
    return ex, handle, got


def test_a_progress_beat_asks_the_server_only_for_the_live_view(monkeypatch):
    ex, handle, got = _executor(monkeypatch, live=False)
    ex._poll(None)
    assert handle.live.calls == 0 and got == []  # -q or not a terminal: nothing more than before
    ex, handle, got = _executor(monkeypatch, live=True)
    ex._poll(LiveTracker(0.0))
    [snap] = got
    assert handle.live.calls == 1
    assert (snap.ok, snap.failed, snap.in_flight, snap.done) == (3, 1, 4, 4)
    assert snap.ttft_p50_s == pytest.approx(0.2, rel=0.045) and snap.tpot_p50_s is None
    assert snap.server is not None and (snap.server.running, snap.server.spec_steps) == (8, 4)


def _ui(terminal: bool, quiet: bool = False) -> ProgressUI:
    return ProgressUI(Console(file=io.StringIO(), force_terminal=terminal, width=120), quiet)


def test_the_live_panel_is_shown_only_on_a_terminal_without_quiet():
    assert _ui(terminal=False).callbacks().live is False  # a pipe, a CI log: the bars as before
    assert _ui(terminal=True, quiet=True).callbacks().live is False
    ui = _ui(terminal=True)
    assert ui.callbacks().live is True
    t = LiveTracker(0.0)
    sk = LatencySketch()
    for x in (0.004, 0.005, 0.006):
        sk.add(x)
    snap = t.update(12.0, GeneratorProgress({"ok": 3, "scheduled": 10, "in_flight": 2}, LatencySketch(), sk), None)
    ui.point_start("p1", 10)
    ui.point_live(snap)
    assert ui.progress.panel is not None
    out = Console(file=io.StringIO(), width=120, record=True)
    out.print(ui.progress.panel)
    text = out.export_text()
    assert "live · p1 · 12 s" in text and "done 3 / 10 · in flight 2 · failed 0" in text
    p50, p99 = sk.quantile(0.5), sk.quantile(0.99)
    assert p50 == pytest.approx(0.005, rel=0.045) and p99 == pytest.approx(0.006, rel=0.045)
    assert f"TPOT      p50 {p50 * 1e3:.1f} ms · p99 {p99 * 1e3:.1f} ms" in text
    assert "server    no answer this beat" in text
    ui.point_end("p1", types.SimpleNamespace(flags=[], status="complete"))
    assert ui.progress.panel is None  # the panel is of the running level only


def test_the_server_line_shows_what_the_server_reports():
    snap = LiveTracker(0.0).update(
        1.0, GeneratorProgress(), ServerGauges(running=17, queued=0, spec_steps=3, gen_throughput=1500.4)
    )
    out = Console(file=io.StringIO(), width=140, record=True)
    out.print(live_panel("p", snap))
    text = out.export_text()
    assert "running 17 · queued 0 · spec steps 3 · gen 1,500 tok/s" in text and "power" not in text
