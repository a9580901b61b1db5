"""The simulator's adaptive speculation through its HTTP server in real time (no Ray): the active tier in the gauge
and internal_states follows the load (the controller's decisions are checked on the virtual clock in
tests/unit/test_sim_adaptive.py)."""

from __future__ import annotations

import asyncio
import re

import pytest


def _gauge(text: str, name: str) -> float:
    m = re.search(rf"^sglang:{name}\{{[^}}]*\}} ([0-9.e+-]+)$", text, re.M)
    assert m, name
    return float(m.group(1))


@pytest.mark.server  # an in-process HTTP server, as test_sim_server.py's
def test_the_active_tier_gauge_changes_when_load_goes_from_1_to_32():
    """One request at a time routes to slot "1" ([1, 3, 5, 7]); 32 at once (the radix cache off, so 48 may run)
    pad to the 32 graph and route to slot "32" ([0, 1]). The gauges and internal_states show the active tier, the
    top-level /server_info keeps the startup 3."""
    from aiohttp.test_utils import TestClient, TestServer

    from rig.sim.app import create_app
    from rig.sim.launch import build_server, prepare

    argv = ["--model-path", "m", "--tp-size", "4", "--skip-server-warmup", "--enable-metrics"]
    argv += ["--speculative-algorithm", "EAGLE", "--speculative-adaptive", "--decode-log-interval", "1"]
    argv += ["--disable-radix-cache"]

    async def go():
        srv = build_server(*prepare(argv))
        srv.ready = True
        body = {
            "text": "Tell me a long story about rivers",
            "sampling_params": {"max_new_tokens": 48, "temperature": 0},
        }
        async with TestClient(TestServer(create_app(srv))) as c:
            await (await c.post("/generate", json=body)).read()
            alone = await (await c.get("/metrics")).text()
            info_alone = await (await c.get("/server_info")).json()
            body["sampling_params"]["max_new_tokens"] = 400
            many = [asyncio.ensure_future(c.post("/generate", json=body)) for _ in range(32)]
            crowded, info_crowded = "", {}
            for _ in range(400):  # until 32 run and a decode among them has been logged (bounded: ~20 s)
                await asyncio.sleep(0.05)
                crowded = await (await c.get("/metrics")).text()
                if _gauge(crowded, "num_running_reqs") >= 32 and _gauge(crowded, "spec_num_steps") <= 1:
                    info_crowded = await (await c.get("/server_info")).json()
                    break
            for f in many:
                (await f).close()
        await srv.engine.stop()
        return alone, info_alone, crowded, info_crowded

    alone, info_alone, crowded, info_crowded = asyncio.run(go())
    assert _gauge(alone, "spec_num_steps") in (3, 5, 7)
    assert _gauge(alone, "spec_num_draft_tokens") == _gauge(alone, "spec_num_steps") + 1
    assert info_alone["internal_states"][0]["speculative_num_steps"] == _gauge(alone, "spec_num_steps")
    assert _gauge(crowded, "spec_num_steps") in (0, 1), "the gauge never showed slot 32's tier under 32 requests"
    assert info_crowded["internal_states"][0]["speculative_num_steps"] in (0, 1)
    assert info_crowded["speculative_num_steps"] == info_alone["speculative_num_steps"] == 3  # the startup value
