"""One streamed HTTP request, timed on the monotonic clock, turned into the request-specific part of a record."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from rig.config import Timeouts
from rig.loadgen import http1
from rig.loadgen.apis import Api, StreamError, StreamState
from rig.loadgen.refusals import http_error
from rig.loadgen.sse import SSEBytesParser, array_events
from rig.workloads.base import Turn

_log = logging.getLogger(__name__)


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


def output_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", errors="replace")).hexdigest()[:32]


def _loads(data: bytes) -> Any:
    """One event's JSON; bytes that are not UTF-8 are replaced (as a text reader would) instead of failing."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            return json.loads(data.decode("utf-8", errors="replace"))
        except ValueError:
            text = data.decode("utf-8", errors="replace")
            raise StreamError(f"malformed event: not JSON: {text[:80]!r}") from None


class _Folder:
    """Folds a stream's SSE payloads into an Outcome; the arrival time of each piece is the read that brought it."""

    __slots__ = ("api", "out", "state", "parser", "send", "on_first")

    def __init__(self, api: Api, out: Outcome, on_first: Callable[[], None] | None = None) -> None:
        self.api = api
        self.out = out
        self.state = out.state
        self.parser = SSEBytesParser()
        self.send = out.send_mono
        self.on_first = on_first

    def feed(self, chunk: bytes, at: float) -> None:
        array, count, rest = self.parser.feed_objects(chunk)
        if count:
            folded = self.fold_array(array, count, at)
            if folded < count:  # a malformed event: it and the ones after it parsed one by one, in order
                rest = array_events(array)[folded:] + rest
        if rest:
            self.consume(rest, at)

    def fold_array(self, array: bytes, count: int, at: float) -> int:
        """Fold one read's events given as one JSON array text (every one arrived at that read); how many it did."""
        out = self.out
        tokens = out.chunk_tokens
        before = len(tokens)
        try:
            return self.api.fold_array(array, count, self.state, tokens)
        finally:  # also when an event raised: the ones before it keep their arrival
            added = len(tokens) - before
            if added:
                out.chunk_offsets.extend([at - self.send] * added)
                if out.first_mono is None:
                    out.first_mono = at
                    if self.on_first is not None:
                        self.on_first()

    def consume(self, events: list[bytes], at: float) -> None:
        """Fold events one by one, each parsed just before its fold ([DONE], malformed events, a stream's tail)."""
        if not events:
            return
        state, out, fold = self.state, self.out, self.api.fold
        offset = at - self.send  # every event of one read arrived at that read
        for obj in events:
            if obj[:1] != b"{" and obj.strip() == b"[DONE]":
                state.done = True
                continue
            obj = _loads(obj)
            n = fold(obj, state)
            if n > 0:
                if out.first_mono is None:
                    out.first_mono = at
                    if self.on_first is not None:
                        self.on_first()
                out.chunk_offsets.append(offset)
                out.chunk_tokens.append(n)

    def close(self, at: float) -> None:
        """End of the body: the last events, and whether the stream ended complete."""
        tail, cut = self.parser.close()
        try:
            self.consume(tail, at)
        except StreamError:
            if not cut:
                raise
            raise StreamError("truncated stream: ended mid-event") from None
        out, state = self.out, self.state
        if not state.done and not state.finished:
            out.status = "failed"
            out.error = "truncated stream: ended mid-event" if cut else "truncated stream: no finish reason"


def _timeout_error(out: Outcome, timeouts: Timeouts) -> None:
    if out.first_mono is None and timeouts.first_token_s < timeouts.total_s:
        out.status, out.error = "failed", f"timeout: no first token within {timeouts.first_token_s:g}s"
    else:
        out.status, out.error = "failed", f"timeout: stream not finished within {timeouts.total_s:g}s"


def unexpected_error(e: BaseException) -> str:
    """The one-line error of an exception no branch maps (a bug, or a server answer no branch foresaw)."""
    return f"internal error: {type(e).__name__}: {' '.join(str(e).split())}"[:300]


def _failed_by(out: Outcome, e: BaseException) -> None:
    """A network or protocol fault with no message of its own: the exception's type and text."""
    out.status, out.error = "failed", f"{type(e).__name__}: {e}"[:300]


def _cancelled(out: Outcome) -> None:
    """The run was stopped mid-request: the record says so (the caller re-raises the cancellation)."""
    out.status, out.error = "cancelled", "cancelled: the run was stopped"
    out.end_mono = time.perf_counter()


def _unexpected(out: Outcome, e: Exception) -> None:
    """A request's unexpected exception: a failed record of its own; the traceback goes to this process's log."""
    out.status, out.error = "failed", unexpected_error(e)
    _log.warning("request failed on an unexpected exception", exc_info=e)


def _no_usage(out: Outcome, api: Api) -> Outcome:
    """A stream that ended without the server's token count: failed, or -- in the plain dialect, where usage is
    the server's choice -- counted from its chunks, and the record says the count is an estimate."""
    st = out.state
    if out.status == "ok" and st.completion_tokens is None:
        if api.dialect.counts_chunks:
            st.completion_tokens = sum(out.chunk_tokens)
            st.tokens_source = "chunks"
        else:
            out.status, out.error = "failed", "server reported no completion token count"
    return out


async def stream_request(
    http: aiohttp.ClientSession | http1.Pool,
    base_url: str,
    api: Api,
    turn: Turn,
    history: list[dict[str, str]],
    model: str,
    timeouts: Timeouts,
    headers: dict[str, str] | None = None,
) -> Outcome:
    """Send one streaming request and fold every event; never raises (a cancellation aside): a fault no branch
    maps becomes the request's ``internal error`` like any other failed request.

    One interface, two HTTP clients: the lean one (``http1.Pool``, the default) or aiohttp (a ``ClientSession``).
    """
    try:
        if isinstance(http, http1.Pool):
            return await _stream_lean(http, base_url, api, turn, history, model, timeouts, headers)
        return await _stream_aiohttp(http, base_url, api, turn, history, model, timeouts, headers)
    except Exception as e:  # raised before the send (building the request): the clients map everything after it
        now = time.perf_counter()
        out = Outcome(send_mono=now, end_mono=now)
        _unexpected(out, e)
        return out


class _LeanSink:
    """The lean client's sink: SSE parsing and folding run in the connection's read callback."""

    __slots__ = ("folder", "out", "fin", "ok_stream", "err_body", "err_kind", "ctype", "deadline", "total_at")

    def __init__(self, folder: _Folder, out: Outcome, fin: asyncio.Future) -> None:
        self.folder = folder
        self.out = out
        self.fin = fin
        self.ok_stream = False
        self.err_body = b""
        self.err_kind = ""
        self.ctype = ""

    def head(self, status: int, headers: dict[str, str], at: float) -> None:
        self.out.http_status = status
        self.ctype = headers.get("content-type", "")
        if status != 200:
            self.err_kind = "status"
        elif "text/event-stream" not in self.ctype:
            self.err_kind = "ctype"
        else:
            self.ok_stream = True

    def body(self, data: bytes, at: float) -> None:
        if self.ok_stream:
            if self.fin.done():
                return  # bytes after [DONE] (the chunked terminator's neighbours): nothing more to record
            self.folder.feed(data, at)
            if self.folder.state.done:
                self.out.end_mono = at
                self.fin.set_result(False)  # finished by [DONE]; the connection reads the message's end itself
        elif len(self.err_body) < 4096:
            self.err_body += data

    def ended(self, fut: asyncio.Future) -> None:
        """The HTTP message ended (True) or broke (an exception): wake the request."""
        exc = fut.exception()  # always retrieved, also after [DONE] already woke the request
        if self.fin.done():
            return
        if exc is not None:
            self.fin.set_exception(exc)
        else:
            self.out.end_mono = time.perf_counter()
            self.fin.set_result(True)


class LeanRequest:
    """One lean-client request built ahead of its send (body, head), so that sending it is one synchronous write.

    ``send_now()`` writes it on an idle keep-alive connection from the timer's own callback (the open loop's
    sender); ``run()`` then reads the response into an Outcome -- or, when nothing was sent yet, connects and
    writes first, as a request built on the spot does.
    """

    __slots__ = (
        "pool",
        "api",
        "timeouts",
        "host",
        "port",
        "request",
        "out",
        "conn",
        "sink",
        "fin",
        "reused",
        "first_at",
        "total_at",
        "deadline",
    )

    def __init__(
        self,
        pool: http1.Pool,
        base_url: str,
        api: Api,
        turn: Turn,
        history: list[dict[str, str]],
        model: str,
        timeouts: Timeouts,
        headers: dict[str, str] | None,
    ) -> None:
        body = orjson.dumps(api.payload(turn, history, model))
        self.host, self.port, prefix = _split(base_url)
        self.request = http1.build_request(self.host, self.port, prefix + api.path, body, headers)
        self.pool, self.api, self.timeouts = pool, api, timeouts
        self.out: Outcome | None = None
        self.conn: http1._Conn | None = None
        self.sink: _LeanSink | None = None
        self.fin: asyncio.Future | None = None
        self.reused = False
        self.deadline: asyncio.Timeout | None = None

    @property
    def sent(self) -> bool:
        return self.out is not None

    def send_now(self) -> bool:
        """Write the request on an idle keep-alive connection now (no await); False when there is none."""
        conn = self.pool.take_idle(self.host, self.port)
        if conn is None:
            return False
        self._begin()  # the send time is this write
        self._write(conn, reused=True)
        return True

    def _begin(self) -> None:
        send = time.perf_counter()
        self.out = Outcome(send_mono=send, end_mono=send)
        now = asyncio.get_running_loop().time()
        self.first_at = now + min(self.timeouts.first_token_s, self.timeouts.total_s)
        self.total_at = now + self.timeouts.total_s

    def _write(self, conn: http1._Conn, reused: bool) -> None:
        out = self.out
        assert out is not None
        self.conn, self.reused = conn, reused
        self.fin = asyncio.get_running_loop().create_future()
        t = self.timeouts
        folder = _Folder(self.api, out, self._first if t.first_token_s < t.total_s else None)
        self.sink = _LeanSink(folder, out, self.fin)
        conn.send(self.request, self.sink).add_done_callback(self.sink.ended)

    def _first(self) -> None:
        """The first token came: the total limit replaces the first-token one (run() may not have started yet)."""
        if self.deadline is not None:
            self.deadline.reschedule(self.total_at)

    async def run(self) -> Outcome:
        """Send (unless ``send_now`` did) and read the response; never raises for server or network faults."""
        if self.out is None:
            self._begin()  # the send time is taken before the connection, as the slip and TTFT always were
        out = self.out
        assert out is not None
        send = out.send_mono
        pool = self.pool
        try:
            async with asyncio.timeout_at(self.first_at if out.first_mono is None else self.total_at) as deadline:
                self.deadline = deadline
                for attempt in (0, 1):
                    if attempt or self.conn is None:
                        opened = pool.opened
                        conn = await pool.acquire(self.host, self.port, self.timeouts.connect_s)
                        self._write(conn, reused=pool.opened == opened)  # reused: an idle keep-alive one
                    try:
                        complete = await self.fin  # type: ignore[misc]
                        break
                    except http1.HTTPError:
                        # A keep-alive connection the server had just closed: nothing was answered, so send again once.
                        if attempt == 0 and self.reused and out.http_status is None:
                            continue
                        raise
                sink = self.sink
                assert sink is not None
                if not sink.ok_stream:
                    text = sink.err_body.decode("utf-8", errors="replace").replace("\n", " ")
                    if sink.err_kind == "status":
                        out.status = "failed"
                        out.error = http_error(out.http_status, text, self.api.dialect, self.api.path)
                    else:
                        out.status = "failed"
                        out.error = f"wrong content type {sink.ctype!r} for a stream: {text[:200]}"
                    return out
                if complete:
                    sink.folder.close(out.end_mono)
        except StreamError as e:
            out.status, out.error = "failed", str(e)[:300]
        except http1.ConnectError as e:
            out.status, out.error = "failed", f"connect: {e}"[:300]
        except TimeoutError:
            _timeout_error(out, self.timeouts)
        except (http1.HTTPError, OSError) as e:
            _failed_by(out, e)
        except asyncio.CancelledError:
            _cancelled(out)
            raise
        except Exception as e:
            _unexpected(out, e)
        finally:
            self.deadline = None
            self.abandon()
            self.conn = self.sink = self.fin = None  # the sink's fold refers back here: no cycle left for the GC
            if out.end_mono == send:
                out.end_mono = time.perf_counter()
        return _no_usage(out, self.api)

    def abandon(self) -> None:
        """Stop listening: a connection still mid-response cannot carry another request, so it is closed."""
        conn, sink = self.conn, self.sink
        if conn is not None and sink is not None and conn.sink is sink and not sink.out.state.done:
            conn.detach()


async def _stream_lean(
    pool: http1.Pool,
    base_url: str,
    api: Api,
    turn: Turn,
    history: list[dict[str, str]],
    model: str,
    timeouts: Timeouts,
    headers: dict[str, str] | None,
) -> Outcome:
    return await LeanRequest(pool, base_url, api, turn, history, model, timeouts, headers).run()


@functools.lru_cache(maxsize=64)
def _split(base_url: str) -> tuple[str, int, str]:
    return http1.split_url(base_url)


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
    body: dict[str, Any],
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


async def _stream_aiohttp(
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
        "completion_tokens_source": st.tokens_source if st.completion_tokens is not None else None,
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
    rec.update(st.speculative)
    rec.update(st.server_ts)
    return rec
