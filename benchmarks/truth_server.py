"""The truth server: an OpenAI-style streaming server that paces tokens and records when it wrote each one.

    python benchmarks/truth_server.py --port 8100 [--itl-ms 10 | --itl-ms 0 [--burst 32]] [--stats-dir DIR]
    python benchmarks/truth_server.py --capacity 3 --workers 4 --cpus 0-3 --client-cpus 4-7   # its ceiling

``--capacity S`` starts ``--workers`` unpaced processes on one port, each pinned to its own core of ``--cpus``,
saturates them for S seconds from cheap raw-socket clients on ``--client-cpus`` (benchmarks/truth_capacity.py)
and prints the streamed tok/s the server sustained (its own count of token writes) and its CPU: the ceiling a
benchmark's offered load must stay well under, so that what it measures is the client.

POST /v1/completions (and /v1/chat/completions) with ``"stream": true`` answers with one SSE event per token, each
event its own HTTP chunk (chunked transfer encoding, keep-alive), then a usage chunk and ``data: [DONE]`` -- the
shape vLLM and SGLang send, which a client has to parse event by event. ``max_tokens`` tokens are written per
request. Paced (``--itl-ms`` > 0): token i of a stream is due at ``arrival + ttft + i * itl`` on that stream's own
schedule, one write per token. Unpaced (0), for throughput runs: the whole response body is rendered once when the
request arrives, and every stream writes its next ``--burst`` k tokens (k events, k chunks) in one ``write()`` as
soon as the event loop comes round to it, streams interleaved. k = 1 is one write per token; k = 32 makes the
server's cost per event a small fraction of what any client spends parsing it, so the client is the bottleneck.

The server records the monotonic time of every token write (``time.perf_counter``, the same clock as the
clients on this host): the moment the write() that carried the token returned, i.e. the bytes were handed to the
kernel. In a burst the k tokens went in one write, so they share that one time (the gaps inside a burst are 0 on
the server's side: use k = 1 or the paced mode for timing figures). On SIGUSR1 it dumps them to
``DIR/dump-NNN-PID.npz`` and starts afresh; SIGTERM dumps and exits. Several processes can serve one port
(SO_REUSEPORT), each pinned where the benchmark wants it, so the server is not the bottleneck. ``TruthServer``
starts, dumps and stops a set of them from a benchmark.

Raw asyncio Protocol on uvloop, no web framework: the server must be cheaper per event than any client it judges.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson

HEAD_OK = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def _chunk(payload: bytes) -> bytes:
    """One SSE event as one HTTP chunk."""
    data = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _json_response(status: str, obj: object) -> bytes:
    body = orjson.dumps(obj)
    return f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


class Recorder:
    """Token write times of every stream, grouped per request."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.writes: list[list[float]] = []  # per finished request: perf_counter of each token write
        self.tags: list[str] = []  # per finished request: its tag (in its first token's text)
        self.hashes: list[str] = []  # per finished request: the hash of its whole text
        self.arrivals: list[float] = []
        self.cpu0 = sum(os.times()[:2])
        self.t0 = time.perf_counter()

    def dump(self, path: Path) -> None:
        lens = np.array([len(w) for w in self.writes], dtype=np.int64)
        flat = np.concatenate([np.asarray(w) for w in self.writes]) if self.writes else np.zeros(0)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(
            tmp,
            lens=lens,
            writes=flat,
            arrivals=np.asarray(self.arrivals),
            tags=np.asarray(self.tags, dtype=str),
            hashes=np.asarray(self.hashes, dtype=str),
            cpu_s=sum(os.times()[:2]) - self.cpu0,
            window_s=time.perf_counter() - self.t0,
        )
        tmp.rename(path)
        self.reset()


class Stream:
    """One streaming response on one connection."""

    __slots__ = (
        "conn",
        "n",
        "i",
        "due",
        "rid",
        "tag",
        "model",
        "chat",
        "prompt_tokens",
        "writes",
        "arrival",
        "itl",
        "mid",
        "body",
        "pos",
        "ends",
    )

    def __init__(self, conn: Conn, body: dict, chat: bool, itl: float, ttft: float, rid: str) -> None:
        self.conn = conn
        self.n = max(1, int(body.get("max_tokens") or body.get("max_completion_tokens") or 16))
        self.i = 0
        self.arrival = time.perf_counter()
        self.itl = itl
        self.due = self.arrival + ttft
        self.rid = rid
        self.tag = rid.removeprefix("cmpl-")
        self.model = str(body.get("model") or "truth")
        self.chat = chat
        prompt = body.get("prompt") if not chat else body.get("messages")
        self.prompt_tokens = max(1, len(str(prompt)) // 4)
        self.writes: list[float] = []
        self.mid: bytes | None = None
        self.body: memoryview | None = None  # unpaced: the whole response body, rendered once
        self.pos = 0  # unpaced: how much of the body is written
        self.ends = (0, 0)  # unpaced: the byte lengths of the first and of a middle token's event

    def piece(self, i: int) -> str:
        """Token i's text; the first names the request, so a client's text (or its hash) finds it here."""
        return f" #{self.tag}" if i == 0 else " t"

    def text_hash(self) -> str:
        """sha256[:32] of the whole text, as rig's records keep it (output_hash)."""
        return hashlib.sha256((self.piece(0) + self.piece(1) * (self.n - 1)).encode()).hexdigest()[:32]

    def event(self) -> bytes:
        if 0 < self.i < self.n - 1:  # the middle tokens are all alike: render once per stream
            if self.mid is None:
                self.mid = self._render(self.i)
            return self.mid
        return self._render(self.i)

    def render_body(self) -> None:
        """Unpaced: every token's event, then the usage chunk and [DONE], as one buffer to be written in slices."""
        first = self._render(0)
        if self.n == 1:
            self.ends = (len(first), 0)
            self.body = memoryview(first + self.tail())
            return
        mid = self._render(1) if self.n > 2 else b""
        last = self._render(self.n - 1)
        self.ends = (len(first), len(mid))
        self.body = memoryview(first + mid * (self.n - 2) + last + self.tail())

    def end_of(self, j: int) -> int:
        """Unpaced: the byte offset in the body where the first j tokens' events end (j = n: the whole body)."""
        if j >= self.n:
            return len(self.body)  # type: ignore[arg-type]
        first, mid = self.ends
        return first + (j - 1) * mid

    def _render(self, i: int) -> bytes:
        last = i == self.n - 1
        text = self.piece(i)
        if self.chat:
            choice = {"index": 0, "delta": {"content": text}, "finish_reason": "length" if last else None}
            obj = {"id": self.rid, "object": "chat.completion.chunk", "model": self.model, "choices": [choice]}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length" if last else None}
            obj = {"id": self.rid, "object": "text_completion", "model": self.model, "choices": [choice]}
        return _chunk(orjson.dumps(obj))

    def tail(self) -> bytes:
        usage = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.n,
            "total_tokens": self.prompt_tokens + self.n,
        }
        obj = {"id": self.rid, "object": "text_completion", "model": self.model, "choices": [], "usage": usage}
        return _chunk(orjson.dumps(obj)) + _chunk(b"[DONE]") + b"0\r\n\r\n"


class Conn(asyncio.Protocol):
    """One client connection: HTTP/1.1 keep-alive requests, one at a time."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.paused = False
        self.stream: Stream | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc) -> None:
        self.transport = None
        self.stream = None

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.stream is not None and self.server.itl == 0:
            self.server.loop.call_soon(self.server.step_unpaced, self.stream)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while not self.busy:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip() or 0)
            if len(self.buf) < end + 4 + length:
                return
            body, self.buf = self.buf[end + 4 : end + 4 + length], self.buf[end + 4 + length :]
            self.handle(head[0], body)

    def handle(self, line: str, body: bytes) -> None:
        method, _, rest = line.partition(" ")
        path = rest.split(" ", 1)[0]
        assert self.transport is not None
        if method == "GET" and path in ("/health", "/v1/models"):
            self.transport.write(_json_response("200 OK", {"object": "list", "data": [{"id": "truth"}]}))
            return
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            self.transport.write(_json_response("404 Not Found", {"error": {"message": f"no route {path}"}}))
            return
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError:
            self.transport.write(_json_response("400 Bad Request", {"error": {"message": "body is not JSON"}}))
            return
        srv = self.server
        srv.seq += 1
        st = Stream(self, req, path.endswith("chat/completions"), srv.itl, srv.ttft, f"cmpl-{os.getpid()}-{srv.seq}")
        self.busy, self.stream = True, st
        self.transport.write(HEAD_OK)
        srv.recorder.arrivals.append(st.arrival)
        if srv.itl == 0:
            st.render_body()
            srv.loop.call_soon(srv.step_unpaced, st)
        else:
            srv.loop.call_at(srv.loop.time() + (st.due - time.perf_counter()), srv.step_paced, st)

    def finish(self) -> None:
        self.busy, self.stream = False, None
        if self.buf:
            self.data_received(b"")


class Server:
    def __init__(self, itl_s: float, ttft_s: float, burst: int = 1) -> None:
        self.itl = itl_s
        self.ttft = ttft_s
        self.burst = burst
        self.seq = 0
        self.recorder = Recorder()
        self.loop = asyncio.get_running_loop()

    def _write_token(self, st: Stream) -> bool:
        """Write one token; True when the stream is over."""
        tr = st.conn.transport
        if tr is None:  # the client went away
            return True
        data = st.event()
        tr.write(data)
        st.writes.append(time.perf_counter())  # the moment the bytes went to the kernel
        st.i += 1
        if st.i >= st.n:
            tr.write(st.tail())
            self._finished(st)
            return True
        return False

    def _finished(self, st: Stream) -> None:
        rec = self.recorder
        rec.writes.append(st.writes)
        rec.tags.append(st.tag)
        rec.hashes.append(st.text_hash())
        st.conn.finish()

    def step_unpaced(self, st: Stream) -> None:
        """Write the stream's next `burst` tokens (their events, already rendered) in one write."""
        if st.conn.stream is not st or st.conn.paused:
            return  # resumed by resume_writing
        tr = st.conn.transport
        if tr is None:  # the client went away
            return
        j = min(st.i + self.burst, st.n)
        end = st.end_of(j)  # the last burst carries the usage chunk and [DONE] too
        tr.write(st.body[st.pos : end])  # type: ignore[index]
        t = time.perf_counter()  # the moment the burst went to the kernel: the write time of each of its tokens
        st.writes.extend([t] * (j - st.i))
        st.i, st.pos = j, end
        if j >= st.n:
            self._finished(st)
        elif not st.conn.paused:  # paused: resume_writing schedules the next burst (never two chains per stream)
            self.loop.call_soon(self.step_unpaced, st)

    def step_paced(self, st: Stream) -> None:
        if st.conn.stream is not st:
            return
        # A timer may fire a little early or late; the write time recorded is the truth either way.
        if not self._write_token(st):
            st.due = st.arrival + self.ttft + st.i * st.itl
            self.loop.call_at(self.loop.time() + (st.due - time.perf_counter()), self.step_paced, st)


async def serve(port: int, itl_s: float, ttft_s: float, stats_dir: Path, burst: int = 1) -> None:
    server = Server(itl_s, ttft_s, burst)
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    srv = await loop.create_server(lambda: Conn(server), sock=sock, backlog=4096)
    stop = asyncio.Event()
    n = 0

    def dump() -> None:
        nonlocal n
        server.recorder.dump(stats_dir / f"dump-{n:03d}-{os.getpid()}.npz")
        n += 1

    loop.add_signal_handler(signal.SIGUSR1, dump)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    dump()
    srv.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=None, help="serve on this port (required unless --capacity)")
    ap.add_argument("--capacity", type=float, default=None, metavar="S", help="measure the ceiling for S seconds")
    ap.add_argument("--workers", type=int, default=1, help="--capacity: server processes (one per core of --cpus)")
    ap.add_argument("--cpus", default=None, help="--capacity: the server's cores, e.g. 0-3")
    ap.add_argument("--client-cpus", default=None, help="--capacity: the load clients' cores, e.g. 4-7")
    ap.add_argument("--streams", type=int, default=32, help="--capacity: streams per client process")
    ap.add_argument("--max-tokens", type=int, default=256, help="--capacity: tokens per request")
    ap.add_argument("--itl-ms", type=float, default=0.0, help="gap between a stream's tokens; 0 = unpaced")
    ap.add_argument("--ttft-ms", type=float, default=None, help="time to the first token (default: one ITL)")
    ap.add_argument("--burst", type=int, default=1, help="unpaced: tokens (events) per write; default 1")
    ap.add_argument("--stats-dir", type=Path, default=Path("."))
    a = ap.parse_args()
    if a.capacity is not None:
        from truth_capacity import print_capacity

        print_capacity(a.capacity, a.workers, a.cpus, a.client_cpus, a.streams, a.max_tokens, a.burst)
        return
    if a.port is None:
        ap.error("--port is required (or --capacity S)")
    if a.burst < 1 or (a.burst > 1 and a.itl_ms > 0):
        ap.error("--burst must be >= 1, and > 1 only unpaced (--itl-ms 0)")
    import uvloop

    a.stats_dir.mkdir(parents=True, exist_ok=True)
    ttft = (a.ttft_ms if a.ttft_ms is not None else a.itl_ms) / 1e3
    uvloop.run(serve(a.port, a.itl_ms / 1e3, ttft, a.stats_dir, a.burst))


# ---------------------------------------------------------------- used by the benchmarks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_list(spec: str) -> list[int]:
    """'0-3,8' -> [0, 1, 2, 3, 8] (taskset's list syntax)."""
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


class TruthServer:
    """Start ``workers`` truth-server processes on one port (optionally pinned to ``cpus``: with
    ``one_per_core``, worker i on the i-th core of the list alone), dump, stop."""

    def __init__(
        self,
        stats_dir: Path,
        itl_ms: float = 0.0,
        workers: int = 1,
        cpus: str | None = None,
        ttft_ms: float | None = None,
        burst: int = 1,
        one_per_core: bool = False,
    ) -> None:
        self.port = free_port()
        self.dir = Path(stats_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--port",
            str(self.port),
            "--itl-ms",
            str(itl_ms),
            "--stats-dir",
            str(self.dir),
            "--burst",
            str(burst),
        ]
        if ttft_ms is not None:
            cmd += ["--ttft-ms", str(ttft_ms)]
        cores = cpu_list(cpus) if cpus else []
        if one_per_core and cores:  # the kernel spreads SO_REUSEPORT connections over the workers by hash
            pins = [str(cores[i % len(cores)]) for i in range(workers)]
        else:
            pins = [cpus] * workers if cpus else [None] * workers
        self.procs = [subprocess.Popen(["taskset", "-c", pin, *cmd] if pin else cmd) for pin in pins]
        self.cpus = cpus
        self.dumps = 0
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 20.0) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    time.sleep(0.3)  # let every worker bind
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("truth server did not start")

    def collect(self) -> dict:
        """Dump every worker's records since the last collect and merge them."""
        for p in self.procs:
            p.send_signal(signal.SIGUSR1)
        files = [self.dir / f"dump-{self.dumps:03d}-{p.pid}.npz" for p in self.procs]
        end = time.monotonic() + 30
        while not all(f.exists() for f in files) and time.monotonic() < end:
            time.sleep(0.05)
        self.dumps += 1
        writes, gaps, cpu, window, arrivals, tags, hashes = [], [], 0.0, 0.0, [], [], []
        for f in files:
            z = np.load(f)
            tags += [str(t) for t in z["tags"]]
            hashes += [str(h) for h in z["hashes"]]
            w = z["writes"]
            ofs = np.concatenate([[0], np.cumsum(z["lens"])])
            for a, b in zip(ofs[:-1], ofs[1:], strict=False):
                writes.append(w[a:b])
                if b - a > 1:
                    gaps.append(np.diff(w[a:b]))
            cpu += float(z["cpu_s"])
            window = max(window, float(z["window_s"]))
            arrivals.append(z["arrivals"])
        return {
            "writes": writes,
            "gaps_s": np.concatenate(gaps) if gaps else np.zeros(0),
            "cpu_s": cpu,
            "window_s": window,
            "arrivals": np.concatenate(arrivals) if arrivals else np.zeros(0),
            "requests": len(writes),
            "tokens": int(sum(len(w) for w in writes)),
            "by_tag": dict(zip(tags, writes, strict=False)),
            "by_hash": dict(zip(hashes, writes, strict=False)),
        }

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
