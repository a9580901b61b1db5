"""The simulator's GPU route serves the modelled GPUs in NVML units (integration tier: starts the simulator; the power
model's fast checks are in test_sim_power.py)."""

from __future__ import annotations

import pytest


@pytest.mark.server  # an in-process HTTP server, as test_sim_server.py's
def test_sim_gpu_route_serves_the_modelled_gpus_in_nvml_units():
    """GET /sim/gpu (in-process app): tp GPUs at idle before any request, then a counter that grows with work."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from rig.sim.app import create_app
    from rig.sim.launch import build_server, prepare

    async def go():
        srv = build_server(*prepare(["--model-path", "m", "--tp-size", "4", "--skip-server-warmup"]))
        srv.ready = True
        async with TestClient(TestServer(create_app(srv))) as c:
            idle = await (await c.get("/sim/gpu")).json()
            r = await c.post(
                "/generate",
                json={"text": "hello world " * 50, "sampling_params": {"max_new_tokens": 32, "temperature": 0}},
            )
            await r.read()
            busy = await (await c.get("/sim/gpu")).json()
        await srv.engine.stop()
        return srv, idle, busy

    srv, idle, busy = asyncio.run(go())
    p = srv.profile
    assert idle["source"] == "simulated" and len(idle["gpus"]) == 4
    g0, g1 = idle["gpus"][0], busy["gpus"][0]
    assert g0["power_mw"] == int(p.gpu_idle_w * 1000) and g0["util_gpu_pct"] == 0
    assert g0["power_limit_mw"] == 600_000 and g0["temperature_c"] is None and g0["sm_clock_mhz"] is None
    assert g0["mem_used_bytes"] == int((p.gpu_mem_gb - srv.capacity.available_gpu_mem_gb) * 1e9)
    assert g1["energy_mj"] > g0["energy_mj"] and g1["power_mw"] > g0["power_mw"] and g1["util_gpu_pct"] > 0
    assert all(g["energy_mj"] == g1["energy_mj"] for g in busy["gpus"])  # TP: every GPU runs every forward
