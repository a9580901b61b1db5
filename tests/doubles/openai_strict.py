"""A strict plain-OpenAI server: it holds rig to the fields of OpenAI's API reference and nothing else.

What it answers, each as OpenAI's API does (the reference: platform.openai.com/docs/api-reference; the request fields
as the official SDK declares them, openai-python 3.57 types/completion_create_params.py and
types/chat/completion_create_params.py). Its field lists are its own, written from the SDK, not rig's: an oracle
that shared rig's list would pass whatever rig sends (tests/unit/test_dialects.py compares the two).

- POST /v1/completions and /v1/chat/completions: any request field outside the route's reference, or a
  ``stream_options`` key other than ``include_usage``/``include_obfuscation``, is refused with 400 and OpenAI's error
  object ``{"error": {"message": "Unrecognized request argument supplied: X", "type": "invalid_request_error",
  "param": null, "code": null}}`` (the message of issue 19). ``stream_options`` without ``stream`` is refused too.
  A model other than the served one: 404 ``model_not_found``.
- A stream is SSE ``data: {chunk}`` events ending with ``data: [DONE]``. A completions chunk is a
  ``text_completion`` with ``choices[0].text``; a chat chunk is a ``chat.completion.chunk`` whose first delta
  carries the role, then content deltas, then an empty delta with the finish reason. With
  ``stream_options.include_usage`` every chunk carries ``"usage": null`` and one last chunk with ``"choices": []``
  carries the usage; without it, no usage at all (OpenAI's streaming reference).
- GET /v1/models lists the one model; there is no /health (404), as on OpenAI's API and most gateways.

Its model is parametric, never a lookup: each streamed token is one chunk; a request ends at ``max_tokens``
(finish ``length``) or at the end-of-sequence position ``EOS_MIN + crc32(prompt) % EOS_SPAN`` (finish ``stop``),
whichever comes first: there is no ignore_eos in OpenAI's API, so a long fixed-length request ends early here as it
would on a real model.

``python tests/doubles/openai_strict.py --port N [--model NAME] [--no-usage]`` serves it; ``--no-usage`` never sends
usage (a server that ignores ``stream_options``), for the chunk-count estimate. Tests in-process use ``make_app``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import zlib
from typing import Any

from aiohttp import web

# openai-python 3.57: CompletionCreateParamsBase / CompletionCreateParamsStreaming (types/completion_create_params.py)
COMPLETIONS_FIELDS = frozenset(
    {
        "model",
        "prompt",
        "best_of",
        "echo",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "presence_penalty",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "suffix",
        "temperature",
        "top_p",
        "user",
    }
)
# ... and types/chat/completion_create_params.py
CHAT_FIELDS = frozenset(
    {
        "messages",
        "model",
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "metadata",
        "modalities",
        "moderation",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
# types/chat/chat_completion_stream_options_param.py (both routes take it)
STREAM_OPTIONS = frozenset({"include_usage", "include_obfuscation"})
ROUTE_FIELDS = {"/v1/completions": COMPLETIONS_FIELDS, "/v1/chat/completions": CHAT_FIELDS}

EOS_MIN = 12
EOS_SPAN = 40
MODEL = "strict-model"
MODEL_KEY = web.AppKey("model", str)
USAGE_KEY = web.AppKey("usage", bool)


def _error(
    status: int, message: str, param: str | None = None, code: str | None = None, kind: str = "invalid_request_error"
) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": code}}, status=status)


def _refusal(body: dict[str, Any], route: str) -> web.Response | None:
    """OpenAI's 400 for the first field outside the reference (it names one per answer)."""
    unknown = sorted(set(body) - ROUTE_FIELDS[route])
    so = body.get("stream_options")
    if isinstance(so, dict):
        unknown += [f"stream_options.{k}" for k in sorted(set(so) - STREAM_OPTIONS)]
    if unknown:
        return _error(400, f"Unrecognized request argument supplied: {unknown[0]}")
    if so is not None and not body.get("stream"):
        return _error(
            400, "The 'stream_options' parameter is only allowed when 'stream' is enabled.", param="stream_options"
        )
    return None


def _tokens(prompt: str, max_tokens: int) -> tuple[int, str]:
    eos = EOS_MIN + zlib.crc32(prompt.encode()) % EOS_SPAN
    return (max_tokens, "length") if max_tokens <= eos else (eos, "stop")


def _prompt_tokens(text: str) -> int:
    return max(1, len(text.split()))


class _Refused(Exception):
    def __init__(self, response: web.Response) -> None:
        self.response = response


def _prompt_and_limit(body: dict[str, Any], chat: bool) -> tuple[str, Any]:
    """The request's prompt (chat: its messages as JSON) and token limit, as OpenAI validates them."""
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise _Refused(_error(400, "Missing required parameter: 'messages'.", param="messages"))
        return json.dumps(msgs, sort_keys=True), body.get("max_completion_tokens", body.get("max_tokens", 16))
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise _Refused(_error(400, "Missing required parameter: 'prompt'.", param="prompt"))
    return prompt, body.get("max_tokens", 16)


def _check_sampling(body: dict[str, Any], limit: Any) -> None:
    if not isinstance(limit, int) or limit < 1:
        msg = f"Invalid 'max_tokens': integer below minimum value 1, got {limit!r}."
        raise _Refused(_error(400, msg, param="max_tokens"))
    temperature = body.get("temperature", 1.0)
    if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
        msg = f"Invalid 'temperature': must be between 0 and 2, got {temperature!r}."
        raise _Refused(_error(400, msg, param="temperature"))
    if not body.get("stream"):
        raise _Refused(_error(400, "this test double streams only (rig always streams)"))


async def _serve(request: web.Request, route: str) -> web.StreamResponse:
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "We could not parse the JSON body of your request.")
    if not isinstance(body, dict):
        return _error(400, "The request body must be a JSON object.")
    refused = _refusal(body, route)
    if refused is not None:
        return refused
    model = request.app[MODEL_KEY]
    if body.get("model") != model:
        return _error(
            404,
            f"The model `{body.get('model')}` does not exist or you do not have access to it.",
            code="model_not_found",
        )
    chat = route == "/v1/chat/completions"
    try:
        prompt, limit = _prompt_and_limit(body, chat)
        _check_sampling(body, limit)
    except _Refused as e:
        return e.response
    n, finish = _tokens(prompt, limit)
    usage_asked = bool((body.get("stream_options") or {}).get("include_usage")) and request.app[USAGE_KEY]
    rid, created = f"cmpl-{zlib.crc32(prompt.encode()):08x}", int(time.time())
    kind = "chat.completion.chunk" if chat else "text_completion"
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)

    async def send(choices: list[dict[str, Any]], usage: Any = None, last: bool = False) -> None:
        chunk: dict[str, Any] = {"id": rid, "object": kind, "created": created, "model": model, "choices": choices}
        if usage_asked:
            chunk["usage"] = usage if last else None
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

    if chat:
        await send([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
    for i in range(n):
        piece = f" t{i}"
        if chat:
            await send([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
        else:
            await send([{"index": 0, "text": piece, "logprobs": None, "finish_reason": None}])
        if i % 64 == 63:
            await asyncio.sleep(0)  # let other requests' streams interleave
    if chat:
        await send([{"index": 0, "delta": {}, "finish_reason": finish}])
    else:
        await send([{"index": 0, "text": "", "logprobs": None, "finish_reason": finish}])
    if usage_asked:
        pt = _prompt_tokens(prompt)
        await send([], {"prompt_tokens": pt, "completion_tokens": n, "total_tokens": pt + n}, last=True)
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "/v1/completions")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve(request, "/v1/chat/completions")


async def models(request: web.Request) -> web.Response:
    return web.json_response(
        {
            "object": "list",
            "data": [{"id": request.app[MODEL_KEY], "object": "model", "created": 0, "owned_by": "rig-tests"}],
        }
    )


def make_app(model: str = MODEL, usage: bool = True) -> web.Application:
    """``usage=False``: never send usage, whatever stream_options asks (a server that ignores it)."""
    app = web.Application()
    app[MODEL_KEY], app[USAGE_KEY] = model, usage
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--no-usage", action="store_true")
    args = ap.parse_args()
    web.run_app(make_app(args.model, not args.no_usage), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
