"""A tiny SGLang-shaped streaming server for client tests; the prompt text picks a behaviour (MODE:<name>)."""

from __future__ import annotations

import asyncio
import json
import re

from aiohttp import web


def _mode(text: str) -> str:
    m = re.search(r"MODE:(\w+)", text)
    return m.group(1) if m else "ok"


async def generate(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    text = body.get("text") or body.get("prompt") or json.dumps(body.get("messages"))
    mode = _mode(text)
    n = int(body.get("sampling_params", {}).get("max_new_tokens", body.get("max_tokens", 4)))
    if mode == "http500":
        return web.json_response({"error": {"message": "internal boom"}}, status=500)
    if mode == "http400":
        return web.json_response({"object": "error", "message": "bad request", "code": 400}, status=400)
    if mode == "json":
        return web.json_response({"text": "not a stream"})
    if mode == "hang":
        await asyncio.sleep(3600)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    out, held = "", b""
    for i in range(n):
        if mode == "slowfirst" and i == 0:
            await asyncio.sleep(3600)
        await asyncio.sleep(0.005)
        if mode == "truncate" and i == n // 2:
            await resp.write(b'data: {"text": "cut')
            return resp
        if mode == "malformed" and i == 1:
            await resp.write(b"data: {not json}\n\n")
            return resp
        if mode == "error_event" and i == 1:
            await resp.write(b'data: {"error": {"message": "scheduler crashed", "code": 500}}\n\n')
            return resp
        step = 2 if i % 2 else 1  # alternate one- and two-token chunks, as under speculation
        out += " tok" * step
        done = i == n - 1
        meta = {
            "id": "x",
            "prompt_tokens": len(text.split()),
            "completion_tokens": len(out.split()),
            "cached_tokens": 0,
            "finish_reason": {"type": "length", "length": n} if done else None,
        }
        if done:
            meta.update(spec_verify_ct=n, spec_accept_length=len(out.split()) / n)
            if mode == "badspec":  # a field of the wrong type: no mapped error covers it
                meta["spec_accept_length"] = "n/a"
        event = f"data: {json.dumps({'text': out, 'meta_info': meta})}\n\n".encode()
        if mode == "pairs" and i % 2 == 0 and not done:  # two events in one write: the client reads them together
            held = event
            continue
        await resp.write(held + event)
        held = b""
    if mode != "nodone":
        await resp.write(b"data: [DONE]\n\n")
    return resp


def make_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/generate", generate)
    return app
