"""A server that answers health and models, then stalls every generation mid-stream (issue 23, case 1): run as
``python stall_server.py PORT``; it prints 'ready' once it listens."""

from __future__ import annotations

import asyncio
import sys

from aiohttp import web


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "stall", "object": "model"}]})


async def stall(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if request.path == "/v1/completions":
        first = (
            b'{"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": " tok", '
            b'"finish_reason": null}]}'
        )
    elif request.path == "/v1/chat/completions":
        first = (
            b'{"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, '
            b'"delta": {"content": " tok"}, "finish_reason": null}]}'
        )
    else:
        first = b'{"text": " tok", "meta_info": {"id": "x", "completion_tokens": 1, "finish_reason": null}}'
    await resp.write(b"data: " + first + b"\n\n")
    await asyncio.sleep(3600)  # mid-stream: the first token came, the rest never does
    return resp


def main() -> None:
    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
        app.router.add_post(path, stall)
    print("ready", flush=True)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)


if __name__ == "__main__":
    main()
