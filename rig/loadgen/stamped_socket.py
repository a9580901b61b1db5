"""The lean client's transport: a non-blocking TCP socket whose every read carries the kernel's arrival time.

The socket has SO_TIMESTAMPNS on and is read with ``recvmsg``, whose control message says when the last packet of
that read arrived: a client waiting for a core, or busy with other reads, still stamps each read when its bytes
came in (rig.loadgen.http1 parses what it reads).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import socket
import struct
import sys
import time
from collections.abc import Sequence
from typing import Any, Protocol

READ_SIZE = 256 * 1024  # one read takes at most this much (asyncio's transports read the same)

# Linux's SO_TIMESTAMPNS_OLD = 35, and SCM_TIMESTAMPNS = SO_TIMESTAMPNS (include/uapi/asm-generic/socket.h; glibc's
# bits/socket-constants.h makes SO_TIMESTAMPNS this one wherever time_t is a long): the control message is a struct
# timespec of two native longs, CLOCK_REALTIME. Python's socket module does not export the name. alpha, mips,
# parisc and sparc number their socket options differently, so stamps are asked for only where the generic value holds.
SO_TIMESTAMPNS_OLD = 35
KERNEL_STAMPS = sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64", "riscv64", "ppc64le")
_TIMESPEC = struct.Struct("@ll")
_NO_STAMP = (0, 0, b"")
_CMSG_SPACE = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0


class Preempt(Protocol):
    """Work that must not wait behind a read: before each read the pool runs ``run_due()`` once ``due_ns``
    (``perf_counter_ns``) has passed -- the open loop's sender, so a send due while reads are queued goes first."""

    due_ns: int

    def run_due(self) -> None: ...


class _Pool(Protocol):
    """What a read asks of the connection's pool (rig.loadgen.http1.Pool)."""

    unstamped: int  # reads the kernel gave no arrival stamp for

    @property
    def preempt(self) -> Preempt | None: ...


class Receiver(Protocol):
    """The connection a socket feeds, as an asyncio protocol is fed (rig.loadgen.http1's connection)."""

    @property
    def pool(self) -> _Pool: ...

    def connection_made(self, transport: StampedSocket) -> None: ...

    def data_received(self, data: bytes, at: float | None = None) -> None: ...

    def connection_lost(self, exc: Exception | None) -> None: ...


class StampedSocket:
    """A non-blocking TCP socket watched with ``loop.add_reader``: feeds a ``_Conn`` each read with its arrival time.

    It calls the connection's ``connection_made`` / ``data_received`` / ``connection_lost`` as an asyncio
    transport would (``connection_lost`` on the loop's next turn after a close, an EOF or an error) and offers
    the transport calls the connection uses: ``write`` and ``close``.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, conn: Receiver, bufs: list[memoryview]
    ) -> None:
        self.loop, self.sock, self.conn, self.bufs = loop, sock, conn, bufs  # bufs: the pool's read buffer, shared
        self.fd = sock.fileno()
        self.out: bytes | memoryview = b""  # the part of a write the kernel has not taken yet
        self.closed = False
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a request is one write: no wait for an ACK
        if KERNEL_STAMPS:
            with contextlib.suppress(OSError):  # no stamps: every read is stamped when it is made
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS_OLD, 1)
        conn.connection_made(self)
        loop.add_reader(self.fd, self._readable)

    @classmethod
    async def open(cls, host: str, port: int, conn: Receiver, bufs: list[memoryview]) -> StampedSocket:
        """Connect to the first address of host:port that answers (raises OSError as ``create_connection`` does)."""
        loop = asyncio.get_running_loop()
        infos: Sequence[tuple[Any, ...]]
        try:  # a numeric address needs no resolver thread
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
        except socket.gaierror:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        errors: list[OSError] = []
        for family, kind, proto, _, addr in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, addr)
            except BaseException as e:  # a timeout cancels us here too: never leak the socket
                sock.close()
                if not isinstance(e, OSError):
                    raise
                # "[Errno 111] Connection refused", as uvloop's create_connection said (asyncio's sock_connect says
                # "Connect call failed (addr)"): records keep one text whatever the loop
                errors.append(OSError(e.errno, os.strerror(e.errno)) if e.errno else e)
                continue
            return cls(loop, sock, conn, bufs)
        if len({str(e) for e in errors}) == 1:
            raise errors[0]
        raise OSError(f"Multiple exceptions: {', '.join(map(str, errors))}")

    def _readable(self) -> None:
        pre = self.conn.pool.preempt
        if pre is not None and time.perf_counter_ns() >= pre.due_ns:
            pre.run_due()  # a send came due while reads were queued (or this one ran): it goes first
            if self.closed:
                return
        try:
            n, ancillary, _, _ = self.sock.recvmsg_into(self.bufs, _CMSG_SPACE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._lose(e)
            return
        now = time.perf_counter_ns()
        if n == 0:  # the server closed its side
            self._lose(None)
            return
        # The one control message asked for: when the last packet of this read came in.
        level, kind, data = ancillary[0] if ancillary else _NO_STAMP
        if kind == SO_TIMESTAMPNS_OLD and level == socket.SOL_SOCKET and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            # The kernel's clock is CLOCK_REALTIME, the records' perf_counter: carry the lag across.
            lag = time.time_ns() - sec * 1_000_000_000 - nsec
            if lag > 0:
                now -= lag
        else:
            self.conn.pool.unstamped += 1
        self.conn.data_received(bytes(self.bufs[0][:n]), now / 1e9)

    def write(self, data: bytes) -> None:
        """Send now; whatever the kernel does not take goes out when the socket is writable again."""
        if self.closed:
            return
        if self.out:
            self.out = bytes(self.out) + data
            return
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as e:
            self._lose(e)
            return
        if sent < len(data):
            self.out = memoryview(data)[sent:]
            self.loop.add_writer(self.fd, self._writable)

    def _writable(self) -> None:
        try:
            sent = self.sock.send(self.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._lose(e)
            return
        self.out = self.out[sent:]
        if not self.out:
            self.loop.remove_writer(self.fd)

    def close(self) -> None:
        """Stop reading now (unsent bytes are dropped: the connection is being abandoned)."""
        self._lose(None)

    def _lose(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.fd)
        if self.out:
            self.loop.remove_writer(self.fd)
            self.out = b""
        self.loop.call_soon(self._lost, exc)

    def _lost(self, exc: Exception | None) -> None:
        self.sock.close()
        self.conn.connection_lost(exc)
