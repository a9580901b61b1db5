"""The aiohttp application: SGLang's native routes (server.py) and OpenAI routes (openai_api.py) behind the
middlewares and the fault injector."""

from __future__ import annotations

from aiohttp import web

from rig.sim import faults, openai_api
from rig.sim.server import (
    SimServer,
    flush_cache,
    generate,
    get_server_info,
    health,
    make_middlewares,
    metrics,
    model_info,
    model_one,
    models,
    server_info,
    sim_gpu,
)


def create_app(srv: SimServer) -> web.Application:
    """The routes the simulator serves (a subset of SGLang's entrypoints/http_server.py) on one application."""
    app = web.Application(middlewares=make_middlewares(srv) + faults.install(srv), client_max_size=64 * 1024 * 1024)
    app["srv"] = srv
    r = app.router
    r.add_get("/health", health)
    r.add_get("/health_generate", health)
    r.add_get("/server_info", server_info)
    r.add_get("/get_server_info", get_server_info)
    r.add_get("/model_info", model_info)
    r.add_get("/get_model_info", model_info)
    r.add_get("/v1/models", models)
    r.add_get("/v1/models/{name:.+}", model_one)
    r.add_get("/metrics", metrics)
    r.add_get("/sim/gpu", sim_gpu)  # sim only: the simulated GPU power (rig/sim/power.py)
    r.add_route("GET", "/flush_cache", flush_cache)
    r.add_route("POST", "/flush_cache", flush_cache)
    r.add_post("/generate", generate)
    r.add_post("/v1/completions", openai_api.completions)
    r.add_post("/v1/chat/completions", openai_api.chat_completions)
    return app
