"""The engine's output into its server.log, capped: the head kept whole, the rest in a rotating tail.

An engine at a debug log level (or a server logging every request) wrote 41 MB in 7 s into an uncapped log. The head
holds what rig reads back (SGLang's capacity line, its resolved arguments, the first error of a failed start), the
tail what it ended with; what lies between is counted and left out. The output comes through a pipe a thread drains
(``LogSink``); the actor reads the log as ``text()`` while the engine runs and ``close()`` folds it into one file.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import IO

HEAD_BYTES = 8 << 20  # SGLang 0.5.17 on the H200 logged ~150 kB up to "The server is fired up and ready to roll!"
TAIL_BYTES = 4 << 20  # per tail file; two are kept, so the log ends with 4-8 MiB of the engine's last output
READ_BYTES = 1 << 16


def cut_line(head: int, left_out: int, tail: int) -> str:
    """The line that stands where a capped log left bytes out."""
    return (
        f"[rig: server.log capped: the first {head:,} bytes above, {left_out:,} bytes left out, the last {tail:,} "
        f"below]\n"
    )


class LogSink:
    """Drains an engine's output pipe into ``path`` (the head, up to ``head_bytes`` including what the file already
    held) and ``path.tail`` / ``path.tail.1`` (the rotating tail, ``tail_bytes`` each)."""

    def __init__(self, path: Path, head_bytes: int = HEAD_BYTES, tail_bytes: int = TAIL_BYTES):
        self.path = path
        self.tail = path.with_name(path.name + ".tail")
        self.previous = path.with_name(path.name + ".tail.1")
        self.head_bytes = head_bytes
        self.tail_bytes = tail_bytes
        self.left_out = 0  # bytes rotated out of the tail
        self.unwritten = 0  # bytes a failed write lost
        self._lock = threading.Lock()  # a rotation and a read of the tail
        self._thread: threading.Thread | None = None
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in (self.tail, self.previous):  # an earlier launch's tail was folded into the log at its close
            stale.unlink(missing_ok=True)

    def start(self, pipe: IO[bytes]) -> None:
        self._thread = threading.Thread(target=self._drain, args=(pipe,), name="engine-log", daemon=True)
        self._thread.start()

    def _drain(self, pipe: IO[bytes]) -> None:
        """Read the pipe to its end. A write that fails (a full disk) loses its bytes but never stops the reading: an
        engine whose pipe is not drained blocks on its next log line."""
        fd = pipe.fileno()
        tail: IO[bytes] | None = None
        room = max(0, self.head_bytes - (self.path.stat().st_size if self.path.exists() else 0))
        head: IO[bytes] | None = None
        with contextlib.suppress(OSError):
            head = open(self.path, "ab", buffering=0)  # noqa: SIM115 (open for the engine's lifetime; closed below)
        try:
            while True:
                try:
                    chunk = os.read(fd, READ_BYTES)
                except OSError:  # closed under us (the actor is stopping)
                    break
                if not chunk:
                    break
                try:
                    if room and head is not None:
                        head.write(chunk[:room])
                        chunk, room = chunk[room:], max(0, room - len(chunk))
                    if chunk:
                        tail = self._to_tail(tail, chunk)
                except OSError:
                    self.unwritten += len(chunk)
        finally:
            for f in (head, tail, pipe):
                if f is not None:
                    with contextlib.suppress(OSError):
                        f.close()

    def _to_tail(self, tail: IO[bytes] | None, chunk: bytes) -> IO[bytes]:
        """Append to the tail file, rotating it whenever it holds ``tail_bytes`` (never more)."""
        with self._lock:
            while chunk:
                if tail is None:
                    tail = open(self.tail, "ab", buffering=0)  # noqa: SIM115 (kept open; closed in _drain)
                space = self.tail_bytes - tail.tell()
                if space <= 0:
                    tail.close()
                    with contextlib.suppress(OSError):
                        self.left_out += self.previous.stat().st_size
                    os.replace(self.tail, self.previous)
                    tail = None
                    continue
                tail.write(chunk[:space])
                chunk = chunk[space:]
        assert tail is not None
        return tail

    def join(self, timeout_s: float) -> None:
        """Wait until the pipe is drained (the engine and every child holding its output have exited)."""
        if self._thread is not None:
            self._thread.join(timeout_s)

    def data(self) -> bytes:
        """The log as it stands: the head, and where bytes were left out, a line saying how many, then the tail. The
        cut falls between whole lines, so a secret on a line is masked whole (or is not there at all)."""
        with self._lock:
            head = _read(self.path)
            tail = _read(self.previous) + _read(self.tail)
            left_out = self.left_out
        if not left_out:
            return head + tail  # nothing left out: the output as it came
        kept_head = head[: head.rfind(b"\n") + 1] or head
        kept_tail = tail[tail.find(b"\n") + 1 :]
        gap = left_out + len(head) - len(kept_head) + len(tail) - len(kept_tail)
        return kept_head + cut_line(len(kept_head), gap, len(kept_tail)).encode() + kept_tail

    def text(self) -> str:
        return self.data().decode(errors="replace")

    def close(self, timeout_s: float = 5.0) -> bytes:
        """Once the engine has exited: drain the pipe, fold head and tail into the one log file, and return it."""
        self.join(timeout_s)
        data = self.data()
        with self._lock:
            if self.tail.exists() or self.previous.exists():
                tmp = self.path.with_name(self.path.name + ".tmp")
                tmp.write_bytes(data)
                os.replace(tmp, self.path)
                self.tail.unlink(missing_ok=True)
                self.previous.unlink(missing_ok=True)
        return data


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
