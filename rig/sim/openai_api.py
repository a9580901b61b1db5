"""OpenAI-compatible /v1/completions and /v1/chat/completions with SGLang's shapes and SSE order (contract §2.4)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web

from rig.sim.engine import Stream
from rig.sim.requests import Sampling
from rig.sim.responses import finish_name, matched_stop, meta_info, spec_fields, usage
from rig.sim.sampling import BadRequest, build, stops_of
from rig.sim.server import DONE, SimServer, read_json, sse, start_sse
from rig.sim.text import render_chat


def _oai_error(message: str, status: int = 400) -> web.Response:
    return web.json_response({"object": "error", "message": message, "type": "BadRequestError", "param": None,
                              "code": status}, status=status)


def _sampling(body: dict, max_new: int) -> tuple[Sampling, tuple[str, ...]]:
    """OpenAI fields -> SGLang sampling params (seed -> sampling_seed); unknown fields are ignored."""
    p: dict[str, Any] = {"max_new_tokens": max_new}
    for k in ("temperature", "top_p", "top_k", "ignore_eos", "n"):
        if body.get(k) is not None:
            p[k] = body[k]
    if body.get("seed") is not None:
        p["sampling_seed"] = body["seed"]
    return build(p), stops_of(body.get("stop"))


def _include_usage(srv: SimServer, body: dict) -> bool:
    opts = body.get("stream_options") or {}
    return bool(opts.get("include_usage")) or srv.args.stream_response_default_include_usage


def _sglext(st: Stream, srv: SimServer, body: dict) -> dict | None:
    if body.get("return_spec_tokens_details"):
        d = spec_fields(st, srv.engine.cfg.steps)
        if d:
            return {"spec_tokens_details": d}
    return None


async def completions(request: web.Request) -> web.StreamResponse:
    srv: SimServer = request.app["srv"]
    try:
        body = await read_json(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        ids = prompt if isinstance(prompt, list) else None
        toks, tok_ids = srv.tokenize_prompt(None if ids is not None else prompt, ids)
        max_new = body.get("max_tokens", 16)
        s, stops = _sampling(body, 16 if max_new is None else max_new)
        srv.check_length(len(tok_ids), s.max_new_tokens)
    except BadRequest as e:
        return _oai_error(str(e))
    st = srv.engine.submit(toks, tok_ids, s, rid=body.get("rid"), stops=stops)
    rid = f"cmpl-{st.rid}"
    model = body.get("model") or srv.model
    created = int(time.time())
    if not body.get("stream"):
        await srv.wait_finished(st)
        return web.json_response({
            "id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": st.text, "logprobs": None, "finish_reason": finish_name(st),
                         "matched_stop": matched_stop(st)}],
            "usage": usage(st, cache_report=srv.args.enable_cache_report),
            **({"sglext": x} if (x := _sglext(st, srv, body)) else {}),
        })
    resp = await start_sse(request)
    try:
        sent_text = 0
        async for _ in srv.updates(st, request):
            delta = st.text[sent_text:]
            sent_text = len(st.text)
            if not delta and not st.finished:
                continue
            chunk = {"id": rid, "object": "text_completion", "created": created, "model": model,
                     "choices": [{"index": 0, "text": delta, "logprobs": None,
                                  "finish_reason": finish_name(st), "matched_stop": matched_stop(st)}],
                     "usage": None}
            await resp.write(sse(json.dumps(chunk)))
        await _tail(resp, st, srv, body, rid, "text_completion", created, model)
    except (ConnectionResetError, asyncio.CancelledError):
        srv.engine.abort(st)
        raise
    return resp


async def _tail(resp: web.StreamResponse, st: Stream, srv: SimServer, body: dict, rid: str, obj: str, created: int,
                model: str) -> None:
    """After the last choice chunk: optional sglext chunk, optional usage chunk, then [DONE]."""
    ext = _sglext(st, srv, body)
    if ext:
        await resp.write(sse(json.dumps({"id": rid, "object": obj, "created": created, "model": model,
                                         "choices": [], "sglext": ext})))
    if _include_usage(srv, body):
        u = {k: v for k, v in usage(st, cache_report=srv.args.enable_cache_report).items() if v is not None}
        await resp.write(sse(json.dumps({"id": rid, "object": obj, "created": created, "model": model,
                                         "choices": [], "usage": u})))
    await resp.write(DONE)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    srv: SimServer = request.app["srv"]
    try:
        body = await read_json(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise BadRequest("messages must be a non-empty list of message objects")
        if body.get("input_ids") is not None:
            toks, tok_ids = srv.tokenize_prompt(None, body["input_ids"])
        else:
            toks, tok_ids = srv.tokenize_prompt(render_chat(messages), None)
        max_new = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_new is None:
            max_new = max(0, srv.context_len - len(tok_ids))  # bounded only by the context
        s, stops = _sampling(body, max_new)
        srv.check_length(len(tok_ids), s.max_new_tokens)
    except BadRequest as e:
        return _oai_error(str(e))
    st = srv.engine.submit(toks, tok_ids, s, rid=body.get("rid"), stops=stops)
    rid = f"chatcmpl-{st.rid}"
    model = body.get("model") or srv.model
    created = int(time.time())
    if not body.get("stream"):
        await srv.wait_finished(st)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": st.text, "reasoning_content": None, "tool_calls": None},
            "logprobs": None, "finish_reason": finish_name(st), "matched_stop": matched_stop(st),
        }
        if body.get("return_meta_info"):
            choice["meta_info"] = meta_info(st, srv.engine, enable_metrics=srv.args.enable_metrics)
        return web.json_response({
            "id": rid, "object": "chat.completion", "created": created, "model": model, "choices": [choice],
            "usage": usage(st, cache_report=srv.args.enable_cache_report),
            **({"sglext": x} if (x := _sglext(st, srv, body)) else {}),
        })
    resp = await start_sse(request)

    def chunk(delta: dict, finish: str | None, matched: Any = None) -> bytes:
        return sse(json.dumps({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                               "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish,
                                            "matched_stop": matched}]}))

    try:
        sent_text = 0
        first = True
        async for _ in srv.updates(st, request):
            if first:  # the role chunk goes out when the first output arrives
                await resp.write(chunk({"reasoning_content": None, "role": "assistant", "content": ""}, None))
                first = False
            delta = st.text[sent_text:]
            sent_text = len(st.text)
            if delta:
                await resp.write(chunk({"content": delta}, None))
        if first:
            await resp.write(chunk({"reasoning_content": None, "role": "assistant", "content": ""}, None))
        await resp.write(chunk({}, finish_name(st), matched_stop(st)))
        await _tail(resp, st, srv, body, rid, "chat.completion.chunk", created, model)
    except (ConnectionResetError, asyncio.CancelledError):
        srv.engine.abort(st)
        raise
    return resp
