"""A lean HTTP/1.1 client for one job: POST a JSON body and read a streamed (chunked or sized) response.

Why not aiohttp on the hot path: its per-read machinery (StreamReader, a task wake-up per read, header objects)
costs more CPU than everything else the generator does per streamed event. Here the body bytes go straight from
the socket's read callback into a caller-supplied sink on the event loop's own callback -- no task wake-up per
read. Keep-alive connections are pooled per (host, port).

Arrival times come from the kernel, not from the moment the loop got round to the read: the socket has
SO_TIMESTAMPNS on and is read with ``recvmsg``, whose control message says when the last packet of that read
arrived. A client waiting for a core, or busy with other reads, still stamps each read when its bytes came in.

The caller gets: the status line, the headers (lower-cased names), body bytes as they arrive (chunked framing
removed) with their arrival ``perf_counter``, and the end of the message (or why it broke off).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from operator import ne
from typing import Protocol
from urllib.parse import urlsplit

from rig.loadgen.stamped_socket import READ_SIZE, Preempt, StampedSocket

_Socket = StampedSocket  # the transport of a connection

MAX_HEAD = 64 * 1024  # a response head larger than this is not one the rig can accept


class _HexSizes(dict):
    """Chunk length -> its size line as servers write it (lowercase hex, no padding), filled as lengths appear."""

    def __missing__(self, n: int) -> bytes:
        line = b"%x" % n
        if len(self) < 65536:  # events come in a few sizes; a stream of odd ones must not grow this without end
            self[n] = line
        return line


_HEX_SIZES = _HexSizes()


def whole_chunks(data: bytes, pos: int, body: list[bytes]) -> int:
    """Take every complete chunk from ``pos`` on whose size line is exactly its length in lowercase hex, at once.

    The common stream (one SSE event per chunk, vLLM and SGLang alike) is then de-framed by a few C-level passes
    over the read -- one split at CRLF, one length and one size-line lookup per chunk, one list comparison -- instead
    of a Python step per chunk. Returns where it stopped: the first chunk it does not vet (the last chunk, a chunk
    extension, uppercase or zero-padded hex, a chunk cut off by the end of the read) is left to the step-by-step
    parser, which also raises for bad framing. Splitting at CRLF and finding every data part exactly as long as its
    size line says is the chunked grammar itself (size CRLF data CRLF), so nothing it takes is taken wrongly.
    """
    parts = (data[pos:] if pos else data).split(b"\r\n")
    k = (len(parts) - 1) >> 1  # (size line, data) pairs both followed by CRLF
    if not k:
        return pos
    sizes = parts[0 : 2 * k : 2]
    datas = parts[1 : 2 * k : 2]
    lens = list(map(len, datas))
    hexes = list(map(_HEX_SIZES.__getitem__, lens))
    j = k if sizes == hexes else list(map(ne, sizes, hexes)).index(True)
    if 0 in lens:  # a zero-length data part is the last chunk (or bad framing): the step-by-step parser decides
        j = min(j, lens.index(0))
    if not j:
        return pos
    if j < k:
        del datas[j:], lens[j:], sizes[j:]
    body += datas
    return pos + sum(lens) + sum(map(len, sizes)) + 4 * j


class HTTPError(Exception):
    """The server broke HTTP/1.1 (bad status line, bad chunk framing) or the connection dropped mid-message."""


class ConnectError(Exception):
    """The TCP connection could not be made (refused, unreachable, timed out)."""


class Sink(Protocol):
    """Receives one response, on the event loop's callback (must not block)."""

    def head(self, status: int, headers: dict[str, str], at: float) -> None: ...

    def body(self, data: bytes, at: float) -> None: ...


class _Conn:
    """One keep-alive connection; parses the response head and chunked / sized / close-delimited bodies."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: _Socket | None = None
        self.sink: Sink | None = None
        self.done: asyncio.Future | None = None  # resolves with True (message complete) or an exception
        self.broken = False
        self._buf = b""
        self._state = "idle"  # idle | head | size | data | crlf | trailer | sized | close | done
        self._left = 0
        self._keep = True

    # ---------------------------------------------------------------- called by the socket
    def connection_made(self, transport: _Socket) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.broken = True
        self.pool._forget(self)
        if self._state == "close":  # a close-delimited body ends with the connection
            self._finish()
            return
        if self.done is not None and not self.done.done():
            why = f"connection lost: {exc}" if exc else "server closed the connection mid-response"
            self.done.set_exception(HTTPError(why))
        self._state = "idle"

    def data_received(self, data: bytes, at: float | None = None) -> None:
        """One read's bytes and their arrival ``perf_counter`` (the kernel's stamp, else the time of the read)."""
        if at is None:
            at = time.perf_counter()
        if self.sink is None:  # bytes nobody asked for: the connection is not reusable
            self._fail(HTTPError("unexpected bytes on an idle connection"))
            return
        try:
            self._feed(data, at)
        except Exception as e:  # framing errors and the sink's own errors both end this message
            self._fail(e)

    # ---------------------------------------------------------------- parsing
    def _feed(self, data: bytes, at: float) -> None:
        if self._buf:
            data = self._buf + data
            self._buf = b""
        pos, n = 0, len(data)
        sink = self.sink
        body: list[bytes] = []  # this read's body bytes, framing removed: handed over in one call per read
        try:
            pos = self._frames(data, pos, n, body, at)
        finally:
            if body and self.sink is sink:
                sink.body(body[0] if len(body) == 1 else b"".join(body), at)  # type: ignore[union-attr]
        if self._state == "done":
            self._finish()
        elif pos < n and self.sink is sink:
            self._buf = data[pos:]

    def _frames(self, data: bytes, pos: int, n: int, body: list[bytes], at: float) -> int:
        """Walk the framing of one read; returns where it stopped (the rest waits for more bytes). One step per
        state (``_STEPS``); each returns the new position and whether to go on in this read."""
        vetted = False  # whole_chunks runs once per read: a read it cannot vet is not split again chunk by chunk
        while pos < n:
            st = self._state
            if st == "size" and not vetted:
                vetted = True
                pos = whole_chunks(data, pos, body)
                if pos >= n:
                    break
            step = _STEPS.get(st)
            if step is None:
                raise HTTPError(f"unexpected bytes in state {st}")
            pos, more = step(self, data, pos, n, body, at)
            if not more:
                break
        return pos

    def _step_body(self, data: bytes, pos: int, n: int, body: list[bytes], at: float) -> tuple[int, bool]:
        """A chunk's data, or a body of known length ("sized")."""
        take = min(self._left, n - pos)
        if take:
            body.append(data[pos : pos + take])
        self._left -= take
        pos += take
        if self._left == 0:
            if self._state == "sized":
                self._state = "done"
                return pos, False
            self._state = "crlf"
        return pos, True

    def _step_close(self, data: bytes, pos: int, n: int, body: list[bytes], at: float) -> tuple[int, bool]:
        """A body that ends when the server closes the connection."""
        body.append(data[pos:])
        return n, False

    def _step_crlf(self, data: bytes, pos: int, n: int, body: list[bytes], at: float) -> tuple[int, bool]:
        if n - pos < 2:
            return pos, False
        if data[pos : pos + 2] != b"\r\n":
            raise HTTPError("bad chunked encoding: chunk not followed by CRLF")
        self._state = "size"
        return pos + 2, True

    def _step_size(self, data: bytes, pos: int, n: int, body: list[bytes], at: float) -> tuple[int, bool]:
        """A chunk-size line, and the whole chunk with it when this read holds it (the common case)."""
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            if n - pos > 1024:
                raise HTTPError("bad chunked encoding: chunk size line too long")
            return pos, False
        line = data[pos:eol].split(b";", 1)[0].strip()
        try:
            size = int(line, 16)
        except ValueError:
            raise HTTPError(f"bad chunked encoding: chunk size {line[:20]!r}") from None
        pos = eol + 2
        if size == 0:
            self._state = "trailer"
        elif pos + size + 2 <= n:  # the whole chunk is in this read: take it at once
            if data[pos + size : pos + size + 2] != b"\r\n":
                raise HTTPError("bad chunked encoding: chunk not followed by CRLF")
            body.append(data[pos : pos + size])
            pos += size + 2
        else:
            self._left = size
            self._state = "data"
        return pos, True

    def _step_trailer(self, data: bytes, pos: int, n: int, body: list[bytes], at: float) -> tuple[int, bool]:
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            return pos, False
        if eol == pos:  # the empty line that ends the trailer
            self._state = "done"
            return eol + 2, False
        return eol + 2, True

    def _step_head(self, data: bytes, pos: int, n: int, body: list[bytes], at: float) -> tuple[int, bool]:
        end = data.find(b"\r\n\r\n", pos)
        if end < 0:
            if n - pos > MAX_HEAD:
                raise HTTPError("response head too large")
            return pos, False
        self._head(data[pos:end], at)
        pos = end + 4
        if self._state == "sized" and self._left == 0:
            self._state = "done"
            return pos, False
        return pos, True

    def _head(self, raw: bytes, at: float) -> None:
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HTTPError(f"bad status line {lines[0][:60]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        conn = headers.get("connection", "").lower()
        self._keep = not (conn == "close" or (parts[0] == "HTTP/1.0" and conn != "keep-alive"))
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._state = "size"
        elif "content-length" in headers:
            try:
                self._left = int(headers["content-length"])
            except ValueError:
                raise HTTPError("bad Content-Length") from None
            self._state = "sized"
        elif status in (204, 304) or 100 <= status < 200:
            self._left = 0
            self._state = "sized"
        else:
            self._state = "close"
            self._keep = False
        self.sink.head(status, headers, at)  # type: ignore[union-attr]

    # ---------------------------------------------------------------- ends
    def _finish(self) -> None:
        """The message is complete: resolve the caller and give the connection back (or close it)."""
        self._state = "idle"
        self.sink = None
        self._buf = b""
        if self.done is not None and not self.done.done():
            self.done.set_result(True)
        self.done = None
        if self._keep and not self.broken:
            self.pool._release(self)
        else:
            self.close()

    def _fail(self, exc: Exception) -> None:
        self.sink = None
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.broken = True
        self.pool._forget(self)
        if self.transport is not None:
            self.transport.close()

    # ---------------------------------------------------------------- use
    def send(self, request: bytes, sink: Sink) -> asyncio.Future:
        """Write one request; the returned future resolves when the response message ends."""
        assert self.transport is not None and self._state == "idle"
        self.sink = sink
        self._state = "head"
        self._buf = b""
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.done

    def detach(self) -> None:
        """The caller stops listening before the message ended (done early, timed out, cancelled).

        The connection still holds the rest of that response, so it cannot carry another request: close it.
        """
        if self.sink is not None or self._state != "idle":
            self.sink = None
            self.close()


_STEPS = {
    "data": _Conn._step_body,
    "sized": _Conn._step_body,
    "close": _Conn._step_close,
    "crlf": _Conn._step_crlf,
    "size": _Conn._step_size,
    "trailer": _Conn._step_trailer,
    "head": _Conn._step_head,
}


class Pool:
    """Keep-alive connections per (host, port); a request takes an idle one or opens a new one (no cap)."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], deque[_Conn]] = {}
        self._all: set[_Conn] = set()
        self.closed = False
        self.opened = 0  # connections made (a keep-alive check for tests and benchmarks)
        self.unstamped = 0  # reads the kernel gave no arrival stamp for (stamped at the read instead)
        self._bufs = [memoryview(bytearray(READ_SIZE))]  # every read lands here first: one loop, one read at a time
        self.preempt: Preempt | None = None  # runs before any read once it is due (the open loop's sender)

    def take_idle(self, host: str, port: int) -> _Conn | None:
        """An idle keep-alive connection to (host, port), without waiting; None when there is none."""
        idle = self._idle.get((host, port))
        while idle:
            conn = idle.pop()
            if not conn.broken:
                return conn
        return None

    def idle(self, host: str, port: int) -> int:
        """How many idle keep-alive connections to (host, port) the pool holds (one may have closed since)."""
        q = self._idle.get((host, port))
        return len(q) if q else 0

    @property
    def size(self) -> int:
        """Every open connection, idle or busy."""
        return len(self._all)

    async def acquire(self, host: str, port: int, connect_s: float) -> _Conn:
        conn = self.take_idle(host, port)
        if conn is not None:
            return conn
        return await self._connect(host, port, connect_s)

    async def _connect(self, host: str, port: int, connect_s: float) -> _Conn:
        conn = _Conn(self)
        try:
            await asyncio.wait_for(_Socket.open(host, port, conn, self._bufs), connect_s)
        except TimeoutError:
            raise ConnectError(f"timed out after {connect_s:g}s connecting to {host}:{port}") from None
        except OSError as e:
            raise ConnectError(str(e)) from None
        conn.key = (host, port)  # type: ignore[attr-defined]
        self._all.add(conn)
        self.opened += 1
        return conn

    async def warm(self, host: str, port: int, n: int, connect_s: float) -> int:
        """Open idle connections until (host, port) has ``n``, so that sends find one; returns how many it has.

        A connection that cannot be made is left to the request that would have used it (and its record)."""
        idle = self._idle.setdefault((host, port), deque())
        want = n - sum(not c.broken for c in idle)
        if want > 0:
            got = await asyncio.gather(
                *(self._connect(host, port, connect_s) for _ in range(want)), return_exceptions=True
            )
            for conn in got:
                if isinstance(conn, _Conn):
                    self._release(conn)
        return sum(not c.broken for c in idle)

    def _release(self, conn: _Conn) -> None:
        if self.closed:
            conn.close()
            return
        self._idle.setdefault(conn.key, deque()).append(conn)  # type: ignore[attr-defined]

    def _forget(self, conn: _Conn) -> None:
        self._all.discard(conn)

    async def close(self) -> None:
        self.closed = True
        for conn in list(self._all):
            conn.close()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks

    async def __aenter__(self) -> Pool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def split_url(url: str) -> tuple[str, int, str]:
    """(host, port, path prefix) of an http:// base URL."""
    u = urlsplit(url)
    if u.scheme != "http":
        raise ValueError(f"the lean client speaks plain http only, not {u.scheme!r}: {url}")
    return u.hostname or "127.0.0.1", u.port or 80, u.path.rstrip("/")


def build_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str] | None) -> bytes:
    """The bytes of one POST with a JSON body (keep-alive)."""
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
        f"Content-Length: {len(body)}",
    ]
    for k, v in (headers or {}).items():
        if "\r" in k or "\n" in k or "\r" in v or "\n" in v:
            raise ValueError(f"header {k!r} holds a line break")
        head.append(f"{k}: {v}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
