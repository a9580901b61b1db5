"""The truth server's ceiling: saturate it from cheap raw-socket clients and print what it sustained.

    python benchmarks/truth_server.py --capacity 3 --workers 4 --cpus 0-3 --client-cpus 4-7

Each client process (one per core of ``--client-cpus``, pinned) keeps ``--streams`` keep-alive connections busy:
one streaming request after another, the body read in large reads and only scanned for the end of the chunked
response, so a client spends far less per token than the server (one write per token at ``--burst 1``). The server
counts its own token writes; tok/s = tokens of the requests it finished in a window of S seconds while every
client was busy, / that window. Its CPU over the window tells whether the server (near 100 % of its cores) or the
clients were the limit.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from tempfile import mkdtemp

END = b"0\r\n\r\n"


@dataclass
class Capacity:
    """What the server sustained in the window."""

    tok_s: float
    req_s: float
    server_cpu_pct: float  # of all its cores together (100 % = every worker's core busy)
    workers: int
    window_s: float


class _Stream(asyncio.Protocol):
    """One keep-alive connection sending one streaming request after another; the body only scanned for its end."""

    def __init__(self, request: bytes, deadline: float, done: list[int], closed: asyncio.Future) -> None:
        self.request, self.deadline, self.done, self.closed = request, deadline, done, closed
        self.tail = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.tail = (self.tail + data[-len(END) :])[-len(END) :]
        if self.tail != END:
            return
        self.tail = b""
        self.done[0] += 1
        assert self.transport is not None
        if time.monotonic() < self.deadline:
            self.transport.write(self.request)
        else:
            self.transport.close()

    def connection_lost(self, exc) -> None:  # type: ignore[no-untyped-def]
        if not self.closed.done():
            self.closed.set_result(None)


async def _client(port: int, streams: int, max_tokens: int, seconds: float) -> int:
    body = b'{"model":"truth","prompt":"x","max_tokens":%d,"stream":true}' % max_tokens
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body
    loop = asyncio.get_running_loop()
    done = [0]
    deadline = time.monotonic() + seconds
    waits = []
    for _ in range(streams):
        closed = loop.create_future()
        await loop.create_connection(lambda c=closed: _Stream(request, deadline, done, c), "127.0.0.1", port)
        waits.append(closed)
    await asyncio.gather(*waits)
    return done[0]


def measure(
    seconds: float,
    workers: int,
    cpus: str | None,
    client_cpus: str | None,
    streams: int = 32,
    max_tokens: int = 256,
    burst: int = 1,
) -> Capacity:
    """Start the server (one process per core of ``cpus``), saturate it, return what it sustained."""
    from truth_server import TruthServer, cpu_list

    srv = TruthServer(
        Path(mkdtemp(prefix="truth-cap-")), itl_ms=0, workers=workers, cpus=cpus, burst=burst, one_per_core=True
    )
    clients = cpu_list(client_cpus) if client_cpus else [None]
    warm = 0.5
    try:
        procs = []
        for c in clients:
            cmd = [sys.executable, __file__, str(srv.port), str(streams), str(max_tokens), str(seconds + 2 * warm)]
            procs.append(subprocess.Popen(["taskset", "-c", str(c), *cmd] if c is not None else cmd))
        time.sleep(warm)
        srv.collect()  # the window starts with every client busy
        time.sleep(seconds)
        got = srv.collect()
        for p in procs:
            p.wait(seconds + 30)
    finally:
        srv.stop()
    window = got["window_s"]
    return Capacity(
        tok_s=got["tokens"] / window,
        req_s=got["requests"] / window,
        server_cpu_pct=100 * got["cpu_s"] / (window * workers),
        workers=workers,
        window_s=window,
    )


def print_capacity(
    seconds: float, workers: int, cpus: str | None, client_cpus: str | None, streams: int, max_tokens: int, burst: int
) -> Capacity:
    cap = measure(seconds, workers, cpus, client_cpus, streams, max_tokens, burst)
    n_clients = len(client_cpus.split(",")) if client_cpus else 1
    print(
        f"truth server capacity: {cap.tok_s:,.0f} streamed tok/s ({cap.req_s:,.0f} req/s of {max_tokens} tokens, "
        f"{burst} token(s) per write) sustained over {cap.window_s:.1f} s by {workers} process(es) on cores "
        f"{cpus or 'any'}, server CPU {cap.server_cpu_pct:.0f} % of its cores; load from client processes on "
        f"{client_cpus or 'any core'} ({n_clients} x {streams} streams)"
        + ("" if cap.server_cpu_pct >= 90 else "; the server was not saturated: a lower bound"),
        flush=True,
    )
    return cap


if __name__ == "__main__":  # one client process: PORT STREAMS MAX_TOKENS SECONDS
    port, streams, max_tokens, seconds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    try:
        import uvloop

        uvloop.run(_client(port, streams, max_tokens, seconds))
    except ImportError:
        asyncio.run(_client(port, streams, max_tokens, seconds))
