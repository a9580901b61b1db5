"""OpenAI-compatible /v1/completions and /v1/chat/completions with SGLang's shapes and SSE order (SGLang's
entrypoints/openai/serving_completions.py and serving_chat.py)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web

from rig.sim.engine import Stream
from rig.sim.requests import Sampling
from rig.sim.responses import finish_name, matched_stop, meta_info, speculative_fields, usage
from rig.sim.rids import DuplicateRid
from rig.sim.sampling import BadRequest, build, stops_of
from rig.sim.server import DONE, SimServer, read_json, sse, start_sse, validation_error
from rig.sim.text import render_chat


def _oai_error(message: str, status: int = 400, err_type: str = "BadRequestError") -> web.Response:
    """ErrorResponse (openai/protocol.py) as serving_base.py::create_error_response sends it."""
    return web.json_response(
        {"object": "error", "message": message, "type": err_type, "param": None, "code": status}, status=status
    )


class ServingValueError(BadRequest):
    """A ValueError raised by SGLang's serving code: serving_base.py::handle_request answers 400, type BadRequest."""


# serving_chat.py::_convert_to_internal_request: options that need the whole output at once refuse streaming.
_CHAT_NO_STREAM = (
    (
        "return_prompt_token_ids",
        "return_prompt_token_ids is not supported with streaming. Please set stream=false "
        "when using return_prompt_token_ids=true.",
    ),
    (
        "return_token_ids",
        "return_token_ids is not supported with streaming on /v1/chat/completions. Please set "
        "stream=false when using return_token_ids=true.",
    ),
    (
        "return_meta_info",
        "return_meta_info is not supported with streaming. Please set stream=false when using return_meta_info=true.",
    ),
)


def _sampling(body: dict, max_new: int, defaults: dict[str, Any] | None = None) -> tuple[Sampling, tuple[str, ...]]:
    """OpenAI fields -> SGLang sampling params (seed -> sampling_seed); unknown fields are ignored. ``defaults``: the
    model's generation defaults for the fields the request leaves out (chat only: protocol.py
    ChatCompletionRequest.to_sampling_params; min_p and repetition_penalty are taken but not modelled)."""
    p: dict[str, Any] = dict(defaults or {})
    p["max_new_tokens"] = max_new
    for k in ("temperature", "top_p", "top_k", "ignore_eos", "n"):
        if body.get(k) is not None:
            p[k] = body[k]
    if body.get("seed") is not None:
        p["sampling_seed"] = body["seed"]
    return build(p), stops_of(body.get("stop"))


def _continuous_usage(body: dict) -> bool:
    """openai/utils.py::should_include_usage: stream_options.continuous_usage_stats puts usage on every chunk."""
    opts = body.get("stream_options")
    return isinstance(opts, dict) and bool(opts.get("continuous_usage_stats"))


def _include_usage(srv: SimServer, body: dict) -> bool:
    opts = body.get("stream_options") or {}
    return bool(opts.get("include_usage")) or srv.args.stream_response_default_include_usage


def _sglext(st: Stream, srv: SimServer, body: dict) -> dict | None:
    """SglExt with only spec_tokens_details (openai/utils.py::spec_tokens_details_from_meta_info): present when
    the request asked for it and the finished meta_info has speculative stats."""
    if body.get("return_spec_tokens_details"):
        d = speculative_fields(st, srv.engine.cfg.steps)
        if d:
            return {
                "spec_tokens_details": {
                    "spec_accept_rate": d["spec_accept_rate"],
                    "spec_accept_length": d["spec_accept_length"],
                    "spec_cap_length": 0.0,
                    "spec_block_accept_length": 0.0,
                    "spec_num_correct_drafts": d["spec_num_correct_drafts"],
                    "spec_num_proposed_drafts": d["spec_num_proposed_drafts"],
                    "spec_verify_ct": d["spec_verify_ct"],
                    "spec_correct_drafts_histogram": d["spec_correct_drafts_histogram"],
                    "spec_cap_lens_histogram": [],
                }
            }
    return None


def _ids(st: Stream, start: int) -> tuple[list[int], int]:
    """The output ids after character ``start`` of the stream's id list, and the new end."""
    tail = st.ids_csv[start:].lstrip(",")
    return ([int(x) for x in tail.split(",")] if tail else []), len(st.ids_csv)


def json_media_type(request: web.Request) -> web.Response | None:
    """http_server.py validate_json_request (a dependency of both /v1 routes, 0.5.17 and 0.5.23): a body whose
    Content-Type is not application/json (parameters aside) fails validation, answered 400 'Bad Request'."""
    if request.headers.get("Content-Type", "").lower().split(";", 1)[0].strip() != "application/json":
        err = {
            "loc": ["header", "content-type"],
            "msg": "Unsupported Media Type: Only 'application/json' is allowed",
            "type": "value_error",
        }
        return validation_error(f"1 validation error:\n  {err} [{err}]")  # as 0.5.17 words it (pydantic's repr)
    return None


def typed_int_fields(body: dict, *keys: str) -> web.Response | None:
    """protocol.py's request models type these fields: a value that is not an integer fails FastAPI's validation,
    answered 400 'Bad Request' (recorded on 0.5.17: err_completions_bad_type; its text is pydantic's)."""
    for key in keys:
        v = body.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            err = {"type": "int_parsing", "loc": ("body", key), "msg": "Input should be a valid integer", "input": v}
            return validation_error(f"1 validation error:\n  {err}")
    return None


async def completions(request: web.Request) -> web.StreamResponse:
    srv: SimServer = request.app["srv"]
    if (refused := json_media_type(request)) is not None:
        return refused
    try:
        body = await read_json(request)
        if (refused := typed_int_fields(body, "max_tokens")) is not None:
            return refused
        prompt = body.get("prompt")
        if not prompt or (isinstance(prompt, list) and all(not p for p in prompt)):
            raise BadRequest("Prompt cannot be empty")  # serving_completions.py::_validate_request
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        ids = prompt if isinstance(prompt, list) else None
        toks, tok_ids = srv.tokenize_prompt(None if ids is not None else prompt, ids)
        max_new = body.get("max_tokens", 16)
        s, stops = _sampling(body, 16 if max_new is None else max_new)
        srv.check_length(len(tok_ids), s.max_new_tokens)
    except BadRequest as e:
        return _oai_error(str(e))
    try:  # serving_completions.py: a ValueError before the first chunk is a 400, streaming or not
        st = srv.submit(toks, tok_ids, s, rid=body.get("rid"), stops=stops)
    except DuplicateRid as e:
        return _oai_error(str(e))
    rid = st.rid  # the response id is the request's meta_info id, no "cmpl-" prefix (serving_completions.py)
    want_ids = bool(body.get("return_token_ids"))
    continuous = _continuous_usage(body)
    model = body.get("model") or srv.model
    created = int(time.time())
    if not body.get("stream"):
        await srv.wait_finished(st)
        return web.json_response(
            {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "text": st.text,
                        "logprobs": None,
                        "finish_reason": finish_name(st),
                        "matched_stop": matched_stop(st),
                        **({"token_ids": _ids(st, 0)[0], "prompt_token_ids": tok_ids} if want_ids else {}),
                    }
                ],
                "usage": usage(st, cache_report=srv.args.enable_cache_report),
                "metadata": {"weight_version": "default"},  # weight_versions.py::build_endpoint_weight_version_metadata
                **({"sglext": x} if (x := _sglext(st, srv, body)) else {}),
            }
        )
    resp = await start_sse(request)
    try:
        sent_text = sent_ids = 0
        first = True
        async for _ in srv.updates(st, request):
            # serving_completions.py::_generate_completion_stream: one chunk per scheduler output, even when its
            # text is empty; with return_token_ids each chunk carries that output's new token ids (several per
            # chunk under speculative decoding) and the first one the prompt's ids.
            delta = st.text[sent_text:]
            sent_text = len(st.text)
            choice = {
                "index": 0,
                "text": delta,
                "logprobs": None,
                "finish_reason": finish_name(st),
                "matched_stop": matched_stop(st),
            }
            if want_ids:
                choice["token_ids"], sent_ids = _ids(st, sent_ids)
                if first:
                    choice["prompt_token_ids"] = tok_ids
            first = False
            chunk = {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": usage(st, cache_report=False) if continuous else None,
            }
            await resp.write(sse(json.dumps(chunk)))
        await _tail(resp, st, srv, body, rid, "text_completion", created, model)
    except (ConnectionResetError, asyncio.CancelledError):
        srv.engine.abort(st)
        raise
    return resp


async def _tail(
    resp: web.StreamResponse, st: Stream, srv: SimServer, body: dict, rid: str, obj: str, created: int, model: str
) -> None:
    """After the last choice chunk: optional sglext chunk, optional usage chunk, then [DONE]."""
    ext = _sglext(st, srv, body)
    if ext:
        await resp.write(
            sse(
                json.dumps({"id": rid, "object": obj, "created": created, "model": model, "choices": [], "sglext": ext})
            )
        )
    if _include_usage(srv, body):
        u = {k: v for k, v in usage(st, cache_report=srv.args.enable_cache_report).items() if v is not None}
        await resp.write(
            sse(json.dumps({"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": u}))
        )
    await resp.write(DONE)


def _parse_chat(srv: SimServer, body: dict[str, Any]) -> tuple[Any, Any, Sampling, tuple[str, ...]]:
    """A chat request's prompt tokens and sampling; BadRequest / ServingValueError as SGLang answers them."""
    messages = body.get("messages")
    if messages == []:  # serving_chat.py::_validate_request
        raise BadRequest("Messages cannot be empty.")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise BadRequest("messages must be a non-empty list of message objects")
    if body.get("input_ids") is not None:
        toks, tok_ids = srv.tokenize_prompt(None, body["input_ids"])
    else:
        toks, tok_ids = srv.tokenize_prompt(render_chat(messages), None)
    max_new = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_new is None:
        max_new = max(0, srv.context_len - len(tok_ids))  # bounded only by the context
    s, stops = _sampling(body, max_new, srv.chat_defaults)
    srv.check_length(len(tok_ids), s.max_new_tokens)
    if body.get("stream"):
        for key, message in _CHAT_NO_STREAM:
            if body.get(key):
                raise ServingValueError(message)
    return toks, tok_ids, s, stops


async def chat_completions(request: web.Request) -> web.StreamResponse:
    srv: SimServer = request.app["srv"]
    if (refused := json_media_type(request)) is not None:
        return refused
    try:
        body = await read_json(request)
        if (refused := typed_int_fields(body, "max_tokens", "max_completion_tokens")) is not None:
            return refused
        toks, tok_ids, s, stops = _parse_chat(srv, body)
    except ServingValueError as e:
        return _oai_error(str(e), err_type="BadRequest")
    except BadRequest as e:
        return _oai_error(str(e))
    try:  # serving_chat.py: a ValueError before the first chunk is a 400, streaming or not
        st = srv.submit(toks, tok_ids, s, rid=body.get("rid"), stops=stops)
    except DuplicateRid as e:
        return _oai_error(str(e))
    reply = _ChatReply(srv, body, st)
    if not body.get("stream"):
        return await reply.whole()
    return await reply.stream(request)


class _ChatReply:
    """One chat completion's answer: a whole JSON object, or SSE chunks as serving_chat.py sends them."""

    def __init__(self, srv: SimServer, body: dict[str, Any], st: Any) -> None:
        self.srv, self.body, self.st = srv, body, st
        self.rid = st.rid  # the request's meta_info id, no "chatcmpl-" prefix (serving_chat.py)
        self.model = body.get("model") or srv.model
        self.created = int(time.time())

    async def whole(self) -> web.Response:
        srv, st, body = self.srv, self.st, self.body
        await srv.wait_finished(st)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": st.text, "reasoning_content": None, "tool_calls": None},
            "logprobs": None,
            "finish_reason": finish_name(st),
            "matched_stop": matched_stop(st),
        }
        if body.get("return_meta_info"):
            choice["meta_info"] = meta_info(st, srv.engine, enable_metrics=srv.args.enable_metrics)
        return web.json_response(
            {
                "id": self.rid,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "choices": [choice],
                "usage": usage(st, cache_report=srv.args.enable_cache_report),
                "metadata": {"weight_version": "default"},  # weight_versions.py::build_endpoint_weight_version_metadata
                **({"sglext": x} if (x := _sglext(st, srv, body)) else {}),
            }
        )

    def chunk(self, delta: dict, finish: str | None, matched: Any = None, with_usage: bool = False) -> bytes:
        """openai/sse_utils.py::build_sse_content: the delta always has reasoning_content (null), role and content
        only when set; usage only with continuous_usage_stats, on content chunks (serving_chat.py)."""
        out = {
            "id": self.rid,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "delta": {"reasoning_content": None, **delta},
                    "logprobs": None,
                    "finish_reason": finish,
                    "matched_stop": matched,
                }
            ],
        }
        if with_usage:
            out["usage"] = usage(self.st, cache_report=self.srv.args.enable_cache_report)
        return sse(json.dumps(out))

    async def stream(self, request: web.Request) -> web.StreamResponse:
        srv, st = self.srv, self.st
        resp = await start_sse(request)
        continuous = _continuous_usage(self.body)
        try:
            sent_text = 0
            first = True
            async for _ in srv.updates(st, request):
                if first:  # the role chunk goes out when the first output arrives
                    await resp.write(self.chunk({"role": "assistant", "content": ""}, None))
                    first = False
                delta = st.text[sent_text:]
                sent_text = len(st.text)
                if delta:
                    await resp.write(self.chunk({"content": delta}, None, with_usage=continuous))
            if first:
                await resp.write(self.chunk({"role": "assistant", "content": ""}, None))
            await resp.write(self.chunk({}, finish_name(st), matched_stop(st)))
            await _tail(resp, st, srv, self.body, self.rid, "chat.completion.chunk", self.created, self.model)
        except (ConnectionResetError, asyncio.CancelledError):
            srv.engine.abort(st)
            raise
        return resp
