"""One streamed HTTP request, timed on the monotonic clock, turned into the request-specific part of a record."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from rig.loadgen.apis import Api, StreamError, StreamState
from rig.loadgen.sse import SSEParser
from rig.workloads.base import Turn


@dataclass
class Outcome:
    """The raw result of one request; times are monotonic seconds (time.perf_counter)."""

    send_mono: float
    end_mono: float
    first_mono: float | None = None
    chunk_offsets: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    state: StreamState = field(default_factory=StreamState)
    status: str = "ok"  # ok | failed | cancelled
    http_status: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class ClientTimeouts:
    connect_s: float = 10.0
    first_token_s: float = 600.0
    total_s: float = 3600.0


def output_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", errors="replace")).hexdigest()[:32]


async def stream_request(
    session: aiohttp.ClientSession,
    base_url: str,
    api: Api,
    turn: Turn,
    history: list[dict[str, str]],
    model: str,
    timeouts: ClientTimeouts,
    headers: dict[str, str] | None = None,
) -> Outcome:
    """Send one streaming request and fold every event; never raises for server or network faults."""
    body = api.payload(turn, history, model)
    send = time.perf_counter()
    out = Outcome(send_mono=send, end_mono=send)
    state = out.state
    parser = SSEParser()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s, connect=timeouts.connect_s)

    def consume(events: list[str]) -> None:
        for data in events:
            if data.strip() == "[DONE]":
                state.done = True
                continue
            try:
                obj = json.loads(data)
            except ValueError:
                raise StreamError(f"malformed event: not JSON: {data[:80]!r}") from None
            n = api.fold(obj, state)
            if n > 0:
                now = time.perf_counter()
                if out.first_mono is None:
                    out.first_mono = now
                out.chunk_offsets.append(now - send)
                out.chunk_tokens.append(n)

    loop = asyncio.get_running_loop()
    # One deadline covers connect, headers and body: first the first-token limit, then the total limit.
    first_at = loop.time() + min(timeouts.first_token_s, timeouts.total_s)
    total_at = loop.time() + timeouts.total_s
    try:
        async with asyncio.timeout_at(first_at) as deadline, \
                session.post(base_url + api.path, json=body, headers=headers, timeout=timeout) as resp:
            out.http_status = resp.status
            if resp.status != 200:
                text = (await resp.text(errors="replace"))[:300].replace("\n", " ")
                out.status, out.error = "failed", f"HTTP {resp.status}: {text}"
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
                consume(parser.feed(chunk))
                if out.first_mono is not None and deadline.when() != total_at:
                    deadline.reschedule(total_at)
                if state.done:
                    break
            tail, cut = parser.close()
            try:
                consume(tail)
            except StreamError:
                if not cut:
                    raise
                raise StreamError("truncated stream: ended mid-event") from None
            if not state.done and not state.finished:
                out.status = "failed"
                out.error = "truncated stream: ended mid-event" if cut else "truncated stream: no finish reason"
    except StreamError as e:
        out.status, out.error = "failed", str(e)[:300]
    except aiohttp.ServerTimeoutError as e:  # connect timeout (also a TimeoutError: must come first)
        out.status, out.error = "failed", f"connect: {e or 'timed out'}"[:300]
    except TimeoutError:
        if out.first_mono is None and timeouts.first_token_s < timeouts.total_s:
            out.status, out.error = "failed", f"timeout: no first token within {timeouts.first_token_s:g}s"
        else:
            out.status, out.error = "failed", f"timeout: stream not finished within {timeouts.total_s:g}s"
    except aiohttp.ClientConnectorError as e:
        out.status, out.error = "failed", f"connect: {e.os_error or e}"
    except (aiohttp.ClientError, OSError) as e:
        out.status, out.error = "failed", f"{type(e).__name__}: {e}"[:300]
    except asyncio.CancelledError:
        out.status, out.error = "cancelled", "cancelled: the run was stopped"
        out.end_mono = time.perf_counter()
        raise
    finally:
        if out.end_mono == send:
            out.end_mono = time.perf_counter()
    if out.status == "ok" and state.completion_tokens is None:
        out.status, out.error = "failed", "server reported no completion token count"
    return out


def request_fields(turn: Turn, out: Outcome) -> dict[str, Any]:
    """The request-specific columns of a record (identity and point columns are added by the generator)."""
    st = out.state
    ttft = (out.first_mono - out.send_mono) if out.first_mono is not None else None
    rec: dict[str, Any] = {
        "request_id": turn.request_id,
        "turn": None,
        "category": turn.category,
        "ttft_s": ttft,
        "e2e_s": out.end_mono - out.send_mono,
        "chunk_offsets_s": out.chunk_offsets,
        "chunk_tokens": out.chunk_tokens,
        "prompt_tokens": st.prompt_tokens,
        "completion_tokens": st.completion_tokens,
        "cached_tokens": st.cached_tokens,
        "finish_reason": st.finish_reason,
        "status": out.status,
        "ok": out.status == "ok",
        "http_status": out.http_status,
        "error": out.error,
        "temperature": turn.temperature,
        "top_p": turn.top_p,
        "top_k": turn.top_k,
        "max_tokens": turn.max_tokens,
        "ignore_eos": turn.ignore_eos,
        "seed": turn.seed,
        "output_hash": output_hash(st.text) if out.status == "ok" else None,
        "output_chars": len(st.text),
    }
    rec.update(st.spec)
    rec.update(st.server_ts)
    return rec
