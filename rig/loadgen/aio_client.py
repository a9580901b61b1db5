"""The aiohttp client: one streamed request over an ``aiohttp.ClientSession``, the same Outcome as the lean
client's (rig.loadgen.client), with aiohttp's per-read machinery."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from rig.config import Timeouts
from rig.loadgen.apis import Api, StreamError
from rig.loadgen.bodies import RequestBody
from rig.loadgen.outcome import Outcome, _cancelled, _failed_by, _Folder, _no_usage, _timeout_error, _unexpected
from rig.loadgen.refusals import http_error
from rig.workloads.base import Turn


def reuse_trace() -> aiohttp.TraceConfig:
    """Marks, in a request's trace context, that aiohttp sent it on a reused keep-alive connection."""

    async def reused(session: aiohttp.ClientSession, ctx: Any, params: Any) -> None:
        if isinstance(ctx.trace_request_ctx, dict):
            ctx.trace_request_ctx["reused"] = True

    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(reused)
    return trace


async def _post(
    session: aiohttp.ClientSession,
    url: str,
    body: RequestBody,
    headers: dict[str, str] | None,
    timeout: aiohttp.ClientTimeout,
) -> aiohttp.ClientResponse:
    """POST, sent once more when it went out on a reused keep-alive connection that the server had closed (SGLang
    closes one idle for 5 s: environ.py SGLANG_TIMEOUT_KEEP_ALIVE, uvicorn's timeout_keep_alive) and no byte of a
    response came: a server closes an idle connection only when no request is on it, so nothing was processed. A
    new connection that breaks is never retried (the server may have the request). aiohttp itself retries only
    idempotent methods. As the lean client does (LeanRequest.run)."""
    for attempt in (0, 1):
        ctx: dict[str, bool] = {"reused": False}
        try:
            return await session.post(url, json=body, headers=headers, timeout=timeout, trace_request_ctx=ctx)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            if attempt or not ctx["reused"]:
                raise
    raise AssertionError("unreachable")


async def stream_aiohttp(
    session: aiohttp.ClientSession,
    base_url: str,
    api: Api,
    turn: Turn,
    history: list[dict[str, str]],
    model: str,
    timeouts: Timeouts,
    headers: dict[str, str] | None = None,
) -> Outcome:
    """The aiohttp client: the same records, with aiohttp's per-read machinery."""
    body = api.payload(turn, history, model)
    send = time.perf_counter()
    out = Outcome(send_mono=send, end_mono=send)
    state = out.state
    folder = _Folder(api, out)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s, connect=timeouts.connect_s)

    loop = asyncio.get_running_loop()
    # One deadline covers connect, headers and body: first the first-token limit, then the total limit.
    first_at = loop.time() + min(timeouts.first_token_s, timeouts.total_s)
    total_at = loop.time() + timeouts.total_s
    try:
        async with (
            asyncio.timeout_at(first_at) as deadline,
            await _post(session, base_url + api.path, body, headers, timeout) as resp,
        ):
            out.http_status = resp.status
            if resp.status != 200:
                text = (await resp.text(errors="replace"))[:4096].replace("\n", " ")
                out.status, out.error = "failed", http_error(resp.status, text, api.dialect, api.path)
                return out
            ctype = resp.headers.get("Content-Type", "")
            if "text/event-stream" not in ctype:
                text = (await resp.text(errors="replace"))[:200].replace("\n", " ")
                out.status, out.error = "failed", f"wrong content type {ctype!r} for a stream: {text}"
                return out
            while True:
                chunk = await resp.content.readany()
                if not chunk:
                    break
                folder.feed(chunk, time.perf_counter())
                if out.first_mono is not None and deadline.when() != total_at:
                    deadline.reschedule(total_at)
                if state.done:
                    break
            folder.close(time.perf_counter())
    except StreamError as e:
        out.status, out.error = "failed", str(e)[:300]
    except aiohttp.ServerTimeoutError as e:  # connect timeout (also a TimeoutError: must come first)
        out.status, out.error = "failed", f"connect: {e or 'timed out'}"[:300]
    except TimeoutError:
        _timeout_error(out, timeouts)
    except aiohttp.ClientConnectorError as e:
        out.status, out.error = "failed", f"connect: {e.os_error or e}"
    except (aiohttp.ClientError, OSError) as e:
        _failed_by(out, e)
    except asyncio.CancelledError:
        _cancelled(out)
        raise
    except Exception as e:
        _unexpected(out, e)
    finally:
        if out.end_mono == send:
            out.end_mono = time.perf_counter()
    return _no_usage(out, api)
