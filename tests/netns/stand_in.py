"""A stand-in for the simulated server while `python -m rig.sim` is not available: the fake SGLang stream server
(tests/fake_server.py) plus /health, /v1/models and /flush_cache. Usage: stand_in.py HOST PORT"""

from __future__ import annotations

import sys
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_server import make_app  # noqa: E402


def app() -> web.Application:
    a = make_app()

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "stand-in"}]})

    a.router.add_get("/health", ok)
    a.router.add_post("/flush_cache", ok)
    a.router.add_get("/v1/models", models)
    return a


if __name__ == "__main__":
    web.run_app(app(), host=sys.argv[1], port=int(sys.argv[2]), print=None, access_log=None)
