"""The streaming client against a fake server: good streams and every kind of bad one give one record each."""

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from fake_server import make_app

from rig.config import Timeouts
from rig.loadgen.apis import SGLangNative
from rig.loadgen.client import request_fields, stream_request
from rig.workloads.base import Turn


def turn(mode: str = "ok", n: int = 6) -> Turn:
    return Turn(request_id=f"r-{mode}", messages=({"role": "user", "content": f"hello MODE:{mode}"},), max_tokens=n)


DEFAULT_TIMEOUTS = Timeouts()


async def _send(mode: str, n: int = 6, timeouts: Timeouts = DEFAULT_TIMEOUTS):
    server = TestServer(make_app())
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            url = str(server.make_url("")).rstrip("/")
            return await stream_request(http, url, SGLangNative(), turn(mode, n), [], "m", timeouts)
    finally:
        await server.close()


def send(mode: str, **kw):
    return asyncio.run(_send(mode, **kw))


def test_ok_stream_counts_tokens_from_server():
    out = send("ok", n=6)
    rec = request_fields(turn(), out)
    assert rec["status"] == "ok" and rec["ok"]
    # chunks alternate 1 and 2 tokens: 1+2+1+2+1+2 = 9 tokens as the server counted them
    assert rec["chunk_tokens"] == [1, 2, 1, 2, 1, 2]
    assert rec["completion_tokens"] == 9 == sum(rec["chunk_tokens"])
    assert rec["finish_reason"] == "length"
    assert rec["spec_verify_ct"] == 6 and rec["spec_accept_length"] == pytest.approx(1.5)
    assert 0 < rec["ttft_s"] <= rec["e2e_s"]
    assert rec["chunk_offsets_s"] == sorted(rec["chunk_offsets_s"]) and rec["chunk_offsets_s"][0] == rec["ttft_s"]
    assert rec["output_hash"] and rec["output_chars"] == len(" tok" * 9)


@pytest.mark.parametrize(
    "mode,status,needle",
    [
        ("http500", 500, "HTTP 500: "),
        ("http400", 400, "HTTP 400: "),
        ("json", 200, "wrong content type"),
        ("truncate", 200, "truncated stream: ended mid-event"),
        ("malformed", 200, "malformed event"),
        ("error_event", 200, "scheduler crashed"),
        ("nodone", 200, None),
        ("badspec", 200, "internal error: ValueError: could not convert string to float: 'n/a'"),
    ],
)
def test_faults_become_failed_records(mode, status, needle):
    out = send(mode)
    rec = request_fields(turn(mode), out)
    assert rec["http_status"] == status
    if needle is None:  # a stream that finished but had no [DONE] is still complete
        assert rec["status"] == "ok"
    else:
        assert rec["status"] == "failed" and not rec["ok"] and needle in rec["error"]
        assert rec["output_hash"] is None


def test_first_token_timeout():
    out = send("slowfirst", timeouts=Timeouts(first_token_s=0.3, total_s=5))
    assert out.status == "failed" and "no first token" in out.error and out.end_mono - out.send_mono < 2


def test_connect_refused_is_a_failed_record():
    async def go():
        async with aiohttp.ClientSession() as http:
            return await stream_request(http, "http://127.0.0.1:9", SGLangNative(), turn(), [], "m", Timeouts())

    out = asyncio.run(go())
    assert out.status == "failed" and out.error.startswith("connect")


def test_server_that_never_sends_headers_times_out_on_first_token():
    out = send("hang", timeouts=Timeouts(first_token_s=0.3, total_s=5))
    assert out.status == "failed" and out.error == "timeout: no first token within 0.3s"
    assert out.end_mono - out.send_mono < 2


def test_total_timeout_after_the_first_token():
    out = send("ok", n=400, timeouts=Timeouts(first_token_s=5, total_s=0.3))
    assert out.status == "failed" and out.error == "timeout: stream not finished within 0.3s"
    assert out.first_mono is not None and len(out.chunk_tokens) > 0


# ---------------------------------------------------------------- the lean HTTP/1.1 client: the same records

from rig.loadgen import http1  # noqa: E402


async def _send_lean(modes: list[str], n: int = 6, timeouts: Timeouts = DEFAULT_TIMEOUTS):
    server = TestServer(make_app())
    await server.start_server()
    try:
        async with http1.Pool() as pool:
            url = str(server.make_url("")).rstrip("/")
            outs = [await stream_request(pool, url, SGLangNative(), turn(m, n), [], "m", timeouts) for m in modes]
            return outs, pool.opened
    finally:
        await server.close()


def _comparable(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k not in ("ttft_s", "e2e_s", "chunk_offsets_s")}


@pytest.mark.parametrize(
    "mode", ["ok", "http500", "http400", "json", "truncate", "malformed", "error_event", "nodone", "badspec"]
)
def test_lean_client_records_match_aiohttp(mode):
    (lean,), _ = asyncio.run(_send_lean([mode]))
    ref = send(mode)
    a, b = request_fields(turn(mode), lean), request_fields(turn(mode), ref)
    assert _comparable(a) == _comparable(b)
    assert len(a["chunk_offsets_s"]) == len(b["chunk_offsets_s"])
    if a["ok"]:
        assert 0 < a["ttft_s"] == a["chunk_offsets_s"][0] <= a["e2e_s"]


def test_lean_client_keeps_connections_alive():
    outs, opened = asyncio.run(_send_lean(["ok", "ok", "http500", "ok", "ok"]))
    assert [o.status for o in outs] == ["ok", "ok", "failed", "ok", "ok"]
    assert opened == 1  # five requests, one after another, on one connection


def test_lean_client_drops_a_connection_broken_mid_stream():
    outs, opened = asyncio.run(_send_lean(["malformed", "ok"]))
    assert outs[0].status == "failed" and "malformed event" in outs[0].error
    assert outs[1].status == "ok" and opened == 2  # the abandoned stream's connection was not reused


def test_lean_client_timeouts_and_refused_connection():
    (o,), _ = asyncio.run(_send_lean(["hang"], timeouts=Timeouts(first_token_s=0.3, total_s=5)))
    assert o.status == "failed" and o.error == "timeout: no first token within 0.3s"
    (o,), _ = asyncio.run(_send_lean(["ok"], n=400, timeouts=Timeouts(first_token_s=5, total_s=0.3)))
    assert o.status == "failed" and o.error == "timeout: stream not finished within 0.3s" and o.chunk_tokens

    async def refused():
        async with http1.Pool() as pool:
            return await stream_request(pool, "http://127.0.0.1:9", SGLangNative(), turn(), [], "m", Timeouts())

    o = asyncio.run(refused())
    assert o.status == "failed" and o.error.startswith("connect")


class _Sink:
    def __init__(self):
        self.status, self.body_bytes, self.reads = None, b"", 0

    def head(self, status, headers, at):
        self.status = status

    def body(self, data, at):
        self.body_bytes += data
        self.reads += 1


class _Transport:
    def __init__(self):
        self.written, self.closed = b"", False

    def write(self, data):
        self.written += data

    def get_extra_info(self, name):
        return None

    def close(self):
        self.closed = True


def _exchange(raw: bytes, step: int):
    async def go():
        pool = http1.Pool()
        conn = http1._Conn(pool)
        conn.key = ("h", 1)
        conn.connection_made(_Transport())
        sink = _Sink()
        fut = conn.send(b"POST / HTTP/1.1\r\n\r\n", sink)
        for i in range(0, len(raw), step):
            conn.data_received(raw[i : i + step])
        return sink, fut, pool, conn

    return asyncio.run(go())


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_chunked_framing_split_anywhere(step):
    raw = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'6\r\ndata: \r\n18;ext=1\r\n{"a": 1}\n\ndata: [DONE]\n\n\r\n0\r\nX-Trailer: y\r\n\r\n'
    )
    sink, fut, pool, conn = _exchange(raw, step)
    assert sink.status == 200 and sink.body_bytes == b'data: {"a": 1}\n\ndata: [DONE]\n\n'
    assert fut.result() is True and pool._idle[("h", 1)][0] is conn  # back in the pool for the next request


def test_sized_body_and_bad_framing():
    sink, fut, pool, _ = _exchange(b"HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\nboom", 3)
    assert sink.status == 500 and sink.body_bytes == b"boom" and fut.result() is True
    sink, fut, _, conn = _exchange(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 100)
    with pytest.raises(http1.HTTPError, match="chunk size"):
        fut.result()
    assert conn.transport.closed
    _, fut, _, _ = _exchange(b"garbage\r\n\r\n", 100)
    with pytest.raises(http1.HTTPError, match="bad status line"):
        fut.result()


async def _built_ahead(warm: int):
    """A request built ahead, then sent with send_now (an idle connection) or by run() (none: it connects)."""
    from rig.loadgen.client import LeanRequest

    server = TestServer(make_app())
    await server.start_server()
    try:
        async with http1.Pool() as pool:
            url = str(server.make_url("")).rstrip("/")
            host, port, _ = http1.split_url(url)
            assert await pool.warm(host, port, warm, 5.0) == warm
            assert await pool.warm(host, port, warm, 5.0) == warm and pool.opened == warm  # none opened again
            req = LeanRequest(pool, url, SGLangNative(), turn(), [], "m", Timeouts(), None)
            sent = req.send_now()
            sent_at = req.out.send_mono if req.out else None
            out = await req.run()
            return sent, sent_at, out, pool.opened
    finally:
        await server.close()


def test_request_built_ahead_is_written_at_once_on_an_idle_connection():
    sent, sent_at, out, opened = asyncio.run(_built_ahead(warm=2))
    assert sent and out.send_mono == sent_at and opened == 2  # the send time is that write; no new connection
    (ref,), _ = asyncio.run(_send_lean(["ok"]))
    assert _comparable(request_fields(turn(), out)) == _comparable(request_fields(turn(), ref))


def test_request_built_ahead_without_an_idle_connection_connects_when_run():
    sent, sent_at, out, opened = asyncio.run(_built_ahead(warm=0))
    assert not sent and sent_at is None
    assert out.status == "ok" and opened == 1


class _ThreadServer:
    """The fake server on a loop of its own thread, closing keep-alive connections idle for ``keepalive_s`` (SGLang:
    5 s, uvicorn's timeout_keep_alive from environ.py SGLANG_TIMEOUT_KEEP_ALIVE): the client's loop can be held
    up while the server closes, as on a busy generator."""

    def __init__(self, keepalive_s: float) -> None:
        import threading

        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(make_app(), keepalive_timeout=keepalive_s)
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            self.loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.mark.parametrize("client", ["lean", "aiohttp"])
def test_a_server_closed_idle_connection_costs_no_request(client):
    """SGLang closes a keep-alive connection idle for 5 s. A request sent on one the client has not yet seen
    closed (its loop was busy when the FIN came) gets no response byte: it is sent once more on a new connection,
    and no record fails. A fresh connection that breaks is never sent twice (the server may have the request)."""
    from rig.loadgen.drive import make_session

    server = _ThreadServer(keepalive_s=0.2)

    async def go():
        async with make_session(client) as http:
            first = await stream_request(http, server.url, SGLangNative(), turn("ok", 3), [], "m", Timeouts())
            time.sleep(0.6)  # the server closes the idle connection while this loop is held up
            second = await stream_request(http, server.url, SGLangNative(), turn("ok", 3), [], "m", Timeouts())
            await asyncio.sleep(0.6)  # idle again, this time the loop sees the close
            third = await stream_request(http, server.url, SGLangNative(), turn("ok", 3), [], "m", Timeouts())
            return first, second, third

    try:
        outs = asyncio.run(go())
    finally:
        server.close()
    assert [(o.status, o.error) for o in outs] == [("ok", None)] * 3
    assert [o.state.completion_tokens for o in outs] == [4, 4, 4]
