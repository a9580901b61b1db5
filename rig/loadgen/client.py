"""One streamed HTTP request, timed on the monotonic clock: the lean HTTP/1.1 client's request (``LeanRequest``)
and ``stream_request``, the one entry for both clients (aiohttp's: rig.loadgen.aio_client). What a request came to
and its record's fields: rig.loadgen.outcome."""

from __future__ import annotations

import asyncio
import functools
import time

import aiohttp
import orjson

from rig.config import Timeouts
from rig.loadgen import http1
from rig.loadgen.aio_client import reuse_trace, stream_aiohttp
from rig.loadgen.apis import Api, StreamError
from rig.loadgen.outcome import (
    Outcome,
    _cancelled,
    _failed_by,
    _Folder,
    _no_usage,
    _timeout_error,
    _unexpected,
    output_hash,
    request_fields,
    unexpected_error,
)
from rig.loadgen.refusals import http_error
from rig.workloads.base import Turn

__all__ = [
    "LeanRequest",
    "Outcome",
    "output_hash",
    "request_fields",
    "reuse_trace",
    "stream_request",
    "unexpected_error",
    "_Folder",
    "_no_usage",
]


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
        return await stream_aiohttp(http, base_url, api, turn, history, model, timeouts, headers)
    except Exception as e:  # raised before the send (building the request): the clients map everything after it
        now = time.perf_counter()
        out = Outcome(send_mono=now, end_mono=now)
        _unexpected(out, e)
        return out


class _LeanSink:
    """The lean client's sink: SSE parsing and folding run in the connection's read callback."""

    __slots__ = ("folder", "out", "fin", "ok_stream", "err_body", "err_kind", "ctype", "deadline", "total_at")

    def __init__(self, folder: _Folder, out: Outcome, fin: asyncio.Future[bool]) -> None:
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
        self.fin: asyncio.Future[bool] | None = None
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
                    fin = self.fin
                    assert fin is not None  # _write made it
                    try:
                        complete = await fin
                        break
                    except http1.HTTPError:
                        # A keep-alive connection the server had just closed: nothing was answered, so send again once.
                        if attempt == 0 and self.reused and out.http_status is None:
                            continue
                        raise
                sink = self.sink
                assert sink is not None
                if not sink.ok_stream:
                    self._not_a_stream(sink, out)
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

    def _not_a_stream(self, sink: _LeanSink, out: Outcome) -> None:
        """An answer that is no event stream: an error status (what the server said), or the wrong content type."""
        text = sink.err_body.decode("utf-8", errors="replace").replace("\n", " ")
        out.status = "failed"
        if sink.err_kind == "status":
            out.error = http_error(out.http_status, text, self.api.dialect, self.api.path)
        else:
            out.error = f"wrong content type {sink.ctype!r} for a stream: {text[:200]}"

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
