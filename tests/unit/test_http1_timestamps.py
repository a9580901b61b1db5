"""The lean client's socket: arrival times from the kernel (SO_TIMESTAMPNS), the fallback, and large writes."""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time

import pytest
import uvloop

from rig.loadgen import http1, stamped_socket

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


class _Server:
    """A raw socket server on a thread: answers one request with a chunked head, then one chunk when told to."""

    def __init__(self) -> None:
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.go, self.sent = threading.Event(), threading.Event()
        self.got = 0  # request bytes read (head and body)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.lsock.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(
                next(
                    v
                    for k, _, v in (line.partition(b":") for line in head.split(b"\r\n"))
                    if k.lower() == b"content-length"
                )
            )
            got = len(body)
            while got < length:
                got += len(conn.recv(1 << 20))
            self.got = len(head) + 4 + got
            conn.sendall(HEAD)
            self.go.wait(10)
            conn.sendall(b"5\r\nhello\r\n")
            self.sent.set()
            conn.sendall(b"0\r\n\r\n")
            conn.recv(1)  # until the client closes

    def close(self) -> None:
        self.go.set()
        self.lsock.close()
        self.thread.join(5)


class _Sink:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.headed = loop.create_future()
        self.bodies: list[tuple[bytes, float, float]] = []  # (bytes, arrival time given, time the sink ran)

    def head(self, status, headers, at):
        self.headed.set_result(status)

    def body(self, data, at):
        self.bodies.append((data, at, time.perf_counter()))


def _exchange(loop_kind: str, body: bytes = b"{}", block_s: float = 0.05):
    """One request; the chunk arrives while the loop is blocked for block_s. Returns (sink, times, server)."""
    server = _Server()

    async def go():
        loop = asyncio.get_running_loop()
        async with http1.Pool() as pool:
            conn = await pool.acquire("127.0.0.1", server.port, 5)
            sink = _Sink(loop)
            done = conn.send(http1.build_request("127.0.0.1", server.port, "/", body, None), sink)
            assert await asyncio.wait_for(sink.headed, 10) == 200
            times = {}

            def block():  # the chunk is on the wire before the loop can read it
                times["go"] = time.perf_counter()
                server.go.set()
                assert server.sent.wait(5)
                # sendall returning is not arrival: on a busy host the kernel may queue the loopback packet to
                # ksoftirqd, and it reaches the socket (and is stamped) later. Wait until it is readable.
                assert select.select([conn.transport.sock], [], [], 5)[0], "the chunk never reached the socket"
                time.sleep(block_s)
                times["resumed"] = time.perf_counter()

            loop.call_soon(block)
            assert await asyncio.wait_for(done, 10) is True
            times["unstamped"] = pool.unstamped
            return sink, times

    try:
        with asyncio.Runner(loop_factory=LOOPS[loop_kind]) as runner:
            sink, times = runner.run(go())
    finally:
        server.close()
    return sink, times, server


@pytest.fixture(scope="module")
def stamping():
    """Hold the kernel's receive stamping on, and wait until packets carry stamps.

    The first socket that asks switches it on through a deferred work item (net_enable_timestamp in
    net/core/dev.c), and the last one to close switches it off the same way: until that item runs, reads come
    without a stamp and the client stamps them itself. Here each test opens one connection, so hold it on.
    """
    holder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    holder.bind(("127.0.0.1", 0))
    holder.setsockopt(socket.SOL_SOCKET, stamped_socket.SO_TIMESTAMPNS_OLD, 1)
    holder.settimeout(1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _ in range(500):
            probe.sendto(b"x", holder.getsockname())
            if holder.recvmsg(1, stamped_socket._CMSG_SPACE)[1]:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the kernel stamped no packet within 5 s of SO_TIMESTAMPNS")
    yield
    holder.close()


@pytest.mark.skipif(not stamped_socket.KERNEL_STAMPS, reason="kernel receive stamps are read on Linux only")
@pytest.mark.parametrize("loop_kind", list(LOOPS))
def test_arrival_time_is_the_kernels_not_the_reads(loop_kind, stamping):
    sink, times, _ = _exchange(loop_kind)
    ((data, at, ran),) = [b for b in sink.bodies if b[0]]
    assert data == b"hello"
    assert times["go"] - 0.002 <= at  # not before the server was told to write it
    assert ran - at >= 0.04  # the loop read it ~50 ms after it came in, and the stamp says so
    assert at <= times["resumed"] - 0.04
    assert times["unstamped"] == 0


@pytest.mark.parametrize("loop_kind", list(LOOPS))
def test_without_a_control_message_the_read_is_stamped(loop_kind, monkeypatch):
    monkeypatch.setattr(stamped_socket, "KERNEL_STAMPS", False)  # the socket asks for no stamps: the kernel sends none
    sink, times, _ = _exchange(loop_kind)
    ((data, at, ran),) = [b for b in sink.bodies if b[0]]
    assert data == b"hello"
    assert times["resumed"] <= at <= ran  # stamped when the loop read it, after the block
    assert times["unstamped"] >= 2  # the head and the chunk (and the end, if it came in its own read)


@pytest.mark.parametrize("loop_kind", list(LOOPS))
def test_a_request_larger_than_the_socket_buffer_goes_out_whole(loop_kind):
    body = b'{"prompt": "' + b"x" * (24 << 20) + b'"}'  # more than the kernel takes in one send
    sink, _, server = _exchange(loop_kind, body=body, block_s=0)
    assert b"".join(b[0] for b in sink.bodies) == b"hello"
    assert server.got == len(http1.build_request("127.0.0.1", server.port, "/", body, None))


def test_a_connection_reset_mid_response_is_reported():
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]

    def serve():
        conn, _ = lsock.accept()
        conn.recv(65536)
        conn.sendall(HEAD + b"5\r\nhel")
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()

    async def go():
        async with http1.Pool() as pool:
            conn = await pool.acquire("127.0.0.1", port, 5)
            sink = _Sink(asyncio.get_running_loop())
            with pytest.raises(http1.HTTPError, match="connection lost: .*reset|server closed the connection"):
                await asyncio.wait_for(conn.send(http1.build_request("127.0.0.1", port, "/", b"{}", None), sink), 10)
            return conn, pool

    conn, pool = asyncio.run(go())
    t.join(5)
    lsock.close()
    assert conn.broken and conn not in pool._all


@pytest.mark.parametrize("loop_kind", list(LOOPS))
def test_a_refused_connection_says_so_on_either_loop(loop_kind):
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    lsock.close()  # nothing listens there now

    async def go():
        async with http1.Pool() as pool:
            with pytest.raises(http1.ConnectError, match=r"^\[Errno \d+\] Connection refused$"):
                await pool.acquire("127.0.0.1", port, 5)
            return pool

    with asyncio.Runner(loop_factory=LOOPS[loop_kind]) as runner:
        assert runner.run(go()).opened == 0


def test_a_read_after_the_preempts_due_time_runs_it_first():
    """A send due while reads are queued goes before the read (Pool.preempt): the preempt runs once, before the
    body of the first read handled after its due time reaches the sink; before that time it does not run."""
    server = _Server()
    order: list[str] = []

    class Preempt:
        due_ns = 1 << 62

        def run_due(self) -> None:
            if time.perf_counter_ns() >= self.due_ns:
                order.append("preempt")
                self.due_ns = 1 << 62

    async def go():
        loop = asyncio.get_running_loop()
        async with http1.Pool() as pool:
            pre = pool.preempt = Preempt()
            conn = await pool.acquire("127.0.0.1", server.port, 5)
            sink = _Sink(loop)
            sink.body = lambda data, at: order.append("body")  # type: ignore[method-assign]
            done = conn.send(http1.build_request("127.0.0.1", server.port, "/", b"{}", None), sink)
            assert await asyncio.wait_for(sink.headed, 10) == 200
            assert order == []  # the head's read: nothing was due

            def block():  # the chunk arrives while a callback holds the loop past the due time
                pre.due_ns = time.perf_counter_ns()
                server.go.set()
                assert server.sent.wait(5)
                time.sleep(0.01)

            loop.call_soon(block)
            assert await asyncio.wait_for(done, 10) is True

    try:
        with asyncio.Runner(loop_factory=LOOPS["uvloop"]) as runner:
            runner.run(go())
    finally:
        server.close()
    assert order[:2] == ["preempt", "body"] and order.count("preempt") == 1
