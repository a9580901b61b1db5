"""SGLang's background abort of a reused rid, in the simulator, and rig sending each attempt under ids of its own.

Seen on SGLang 0.5.17 (H200, 2026-12-02): every point after the first of a sweep on one server lost its requests,
``finish_reason`` abort "Aborted", because rig sent the same rids again and SGLang aborts a live rid 2 s after a
stream under that rid ended (``TokenizerManager.create_abort_task``), its scheduler by rid prefix.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from support import start_sim

from rig.contracts import PointColumns
from rig.loadgen.drive import PointRun, make_session
from rig.loadgen.plan import GeneratorPlan
from rig.results import read_requests
from rig.workloads.base import Session, Turn

pytestmark = pytest.mark.server
LONG = 400  # tokens: about 6 s at the sim's steps-0 decode speed (67 tok/s; never faster), past the 2 s timer


@pytest.fixture(scope="module")
def sim_url(tmp_path_factory):
    proc, url, _ = start_sim(tmp_path_factory.mktemp("rid"), "rid", "Qwen/Qwen3.5-122B-A10B", [])
    yield url
    proc.terminate()
    proc.wait(timeout=10)


async def _stream(http: aiohttp.ClientSession, url: str, rid: str, n: int) -> dict:
    """One streamed /generate; returns the last chunk's meta_info."""
    body = {
        "text": "hello there",
        "rid": rid,
        "stream": True,
        "sampling_params": {"max_new_tokens": n, "ignore_eos": True},
    }
    last: dict = {}
    async with http.post(url + "/generate", json=body) as r:
        async for line in r.content:
            if line.startswith(b"data: {"):
                last = json.loads(line[6:])["meta_info"]
    return last


def test_a_reused_rid_is_aborted_two_seconds_after_the_earlier_stream_by_prefix(sim_url):
    async def go():
        async with aiohttp.ClientSession() as http:
            first = await _stream(http, sim_url, "b-t1", 4)
            ended = time.monotonic()
            reused, longer, other = await asyncio.gather(
                _stream(http, sim_url, "b-t1", LONG),  # the same rid: live when the timer fires
                _stream(http, sim_url, "b-t10", LONG),  # "b-t1" is its prefix: the scheduler aborts it too
                _stream(http, sim_url, "c-t1", LONG),  # unrelated: runs to the end
            )
            return first, reused, longer, other, time.monotonic() - ended

    first, reused, longer, other, _ = asyncio.run(go())
    assert first["finish_reason"]["type"] == "length"
    for meta in (reused, longer):
        assert meta["finish_reason"] == {"type": "abort", "message": "Aborted"}
        assert 0 < meta["completion_tokens"] < LONG
    assert other["finish_reason"]["type"] == "length" and other["completion_tokens"] == LONG


async def _refusal(http: aiohttp.ClientSession, url: str, rid: str) -> str:
    """A streamed /generate under a live rid; returns the error event's message."""
    body = {"text": "hello there", "rid": rid, "stream": True, "sampling_params": {"max_new_tokens": 8}}
    async with http.post(url + "/generate", json=body) as r:
        assert r.status == 200  # the refusal comes inside the stream
        events = [json.loads(line[6:]) for line in [ln async for ln in r.content] if line.startswith(b"data: {")]
    (event,) = events
    return event["error"]["message"]


def test_a_refused_duplicate_aborts_the_live_request_two_seconds_later(sim_url):
    """Recorded on SGLang 0.5.17 (tests/data/sglang-0.5.17-recorded: err_duplicate_live_rid, busy_long_stream): the
    duplicate's refusal is a stream too, and carries the background abort, so the original request, live under that
    rid, ends 'abort' 2 s after the refusal."""

    async def go():
        async with aiohttp.ClientSession() as http:
            original = asyncio.create_task(_stream(http, sim_url, "d-t1", LONG))
            await asyncio.sleep(0.5)
            refused = await _refusal(http, sim_url, "d-t1")
            return refused, await original

    refused, meta = asyncio.run(go())
    assert refused == "Duplicate request ID detected: d-t1"
    assert meta["finish_reason"] == {"type": "abort", "message": "Aborted"}
    assert 0 < meta["completion_tokens"] < LONG


def _sessions(n: int) -> tuple[Session, ...]:
    return tuple(
        Session(
            session_id=f"s{i}",
            turns=(
                Turn(
                    request_id=f"s{i}-t0",
                    max_tokens=250,
                    ignore_eos=True,
                    messages=({"role": "user", "content": f"q{i}"},),
                ),
            ),
        )
        for i in range(n)
    )


def _point(name: str) -> PointColumns:
    return PointColumns(
        run_id="r",
        point=name,
        engine="sim",
        workload="t",
        api="sglang-native",
        steps=0,
        server_config="x",
        server_args="{}",
        load_mode="closed",
        concurrency=2,
        rate=None,
        repeat=0,
    )


def test_two_points_back_to_back_with_the_same_requests_lose_nothing(sim_url, tmp_path):
    """Two points of a sweep on one server, the same request ids (they pair up), the second right after the first."""

    async def go():
        async with make_session() as http:
            for name in ("p0", "p1"):
                plan = GeneratorPlan(
                    point=_point(name), generator=0, url=sim_url, model="m", sessions=_sessions(2), slots=2
                )
                await PointRun(plan, tmp_path / name, "hostA", clock_offset_s=0.0).run(http, time.perf_counter() + 0.05)

    asyncio.run(go())
    first, second = (read_requests(tmp_path / n).to_pandas() for n in ("p0", "p1"))
    assert list(second["finish_reason"]) == ["length", "length"], second[["request_id", "error"]].to_dict("records")
    assert second["ok"].all()
    assert sorted(first["request_id"]) == sorted(second["request_id"]) == ["s0-t0", "s1-t0"]  # the pairing key
    wire = [*first["wire_request_id"], *second["wire_request_id"]]
    assert len(set(wire)) == 4 and all(w.split("@")[0] in ("s0-t0", "s1-t0") for w in wire)
