"""A level's common start at scale: the notice grows with the generators and with the measured start broadcast, a
generator reports how early its start call came, and the driver's progress beat waits once, not per generator."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp.test_utils import TestServer
from fake_server import make_app
from test_multihost_units import INFO, sessions

from rig.contracts import GeneratorReport
from rig.loadgen.actor import LoadGenerator
from rig.loadgen.plan import GeneratorPlan
from rig.run import fleet as fleet_mod
from rig.run.fleet import BROADCAST_MARGIN, LEAD_CEILING_PER_GENERATOR_S, START_LEAD_S, Fleet


def fleet_of(n: int, rtt: float = 0.0005) -> Fleet:
    f = Fleet()
    f.active = [(g, None) for g in range(n)]
    f.gen_info = [{"generator": g, "clock_rtt_s": rtt} for g in range(n)]  # type: ignore[typeddict-item]
    return f


def test_the_notice_covers_twice_the_measured_broadcast_beyond_the_old_ceiling():
    """256 generators on 16 cores (tests/data/h200-2026-12-02/control_plane_256.txt): the old rule gave
    10 x RTT + 5 ms x 256 = 1.29 s at most 2.0 s, and the last generator's first send came 0.25 s late."""
    f = fleet_of(256)
    assert f.start_lead_s() == pytest.approx(10 * 0.0005 + 0.005 * 256)  # nothing measured yet: the RTT rule
    f.broadcast_s = 1.3  # the calls took 1.3 s to reach every generator
    assert f.start_lead_s() == pytest.approx(BROADCAST_MARGIN * 1.3)  # 2.6 s: above the old 2.0 s ceiling
    f.broadcast_s = 60.0  # a pathological measurement stays bounded, by a ceiling that grows with N
    assert f.start_lead_s() == pytest.approx(START_LEAD_S[1] + LEAD_CEILING_PER_GENERATOR_S * 256)


def test_a_late_start_call_lengthens_the_next_levels_notice():
    f = fleet_of(256)
    lead = f.start_lead_s()  # 1.285 s
    # the calls reached generators from 1.2 s down to 0.25 s *after* the start: the broadcast took lead + 0.25 s
    shortest = f.observe_start(lead, [1.2, 0.4, None, -0.25])
    assert shortest == pytest.approx(-0.25)
    assert f.broadcast_s == pytest.approx(lead + 0.25)
    assert f.start_lead_s() == pytest.approx(BROADCAST_MARGIN * (lead + 0.25))
    assert f.observe_start(lead, [None]) is None  # no notice reported (an older generator): nothing learnt
    assert f.broadcast_s == pytest.approx(lead + 0.25)
    f.observe_start(f.start_lead_s(), [2.9])  # a quick level does not shorten the notice a slow one needed
    assert f.broadcast_s == pytest.approx(lead + 0.25)


def test_a_generator_reports_how_early_its_start_call_came(tmp_path):
    async def go() -> tuple[GeneratorReport, GeneratorReport]:
        server = TestServer(make_app())
        await server.start_server()
        gen = LoadGenerator(0, str(tmp_path))
        try:
            url = str(server.make_url("")).rstrip("/")
            out = []
            for ahead in (0.3, -0.2):  # the call comes 0.3 s before the common start, then 0.2 s after it
                plan = GeneratorPlan(point=INFO, generator=0, url=url, model="m", sessions=sessions(1), arrivals=(0.0,))
                await gen.prepare(plan)
                out.append(await gen.run_point(time.time() + ahead))
            return out[0], out[1]
        finally:
            await gen.close()
            await server.close()

    early, late = asyncio.run(go())
    assert early.start_notice_s == pytest.approx(0.3, abs=0.05)
    assert late.start_notice_s == pytest.approx(-0.2, abs=0.05)


def test_the_progress_beat_waits_once_for_all_generators_not_once_each(monkeypatch):
    """Three swamped generators: one wait of at most a second, not a second per generator."""
    waits: list[float] = []

    class Handle:
        def __init__(self, ref: str) -> None:
            self.progress = type("M", (), {"remote": staticmethod(lambda: ref)})

    def wait(refs, num_returns, timeout):
        waits.append(timeout)
        return [r for r in refs if r == "quick"], [r for r in refs if r != "quick"]

    def get(ref, timeout=None):
        if ref != "quick":
            waits.append(timeout)  # the old beat: a 1 s get per busy generator
            raise TimeoutError
        return fleet_mod.GeneratorProgress({"ok": 2, "tokens": 10})

    monkeypatch.setattr(fleet_mod.ray, "wait", wait)
    monkeypatch.setattr(fleet_mod.ray, "get", get)
    f = Fleet()
    f.active = [(0, Handle("quick")), (1, Handle("busy")), (2, Handle("busy")), (3, Handle("busy"))]
    total = f.poll_progress()
    assert total.counts["ok"] == 2
    assert waits == [1]


def test_clock_probes_run_hosts_in_parallel_and_each_hosts_generators_in_turn(monkeypatch):
    """Two hosts' first probes meet at a barrier (a serial walk over generators never gets there: it breaks);
    generators of one host are probed one after another, and every offset lands on its own generator."""
    import threading

    meet = threading.Barrier(2, timeout=10)
    probing: dict[str, int] = {}
    lock = threading.Lock()

    def probe(g):
        host, gid = g
        with lock:
            probing[host] = probing.get(host, 0) + 1
            assert probing[host] == 1, "two probes of one host at once"
        if gid in (0, 2):  # the first generator of each host
            meet.wait()
        with lock:
            probing[host] -= 1
        return 0.1 * gid, 0.001 * (gid + 1)

    monkeypatch.setattr(fleet_mod, "measure_clock_offset", probe)
    f = Fleet()
    f.generators = [("a", 0), ("a", 1), ("b", 2), ("b", 3)]
    f.gen_info = [{"generator": g, "node_id": h} for h, g in f.generators]  # type: ignore[typeddict-item]
    f._measure_clocks()
    assert [(i["clock_offset_s"], i["clock_rtt_s"]) for i in f.gen_info] == [
        (0.1 * g, 0.001 * (g + 1)) for g in range(4)
    ]
