"""The run directory itself: claimed and locked for one rig process, checked writable, old attempts moved aside."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import traceback
from pathlib import Path

from rig.results import GPU_METRICS_DIR, REQUESTS_DIR, SERVER_METRICS_DIR
from rig.run.errors import RunError, RunInputError


class RunDirLock:
    """Creates the run directory atomically (a new run) and holds an exclusive lock on it for the whole run."""

    def __init__(self, run_dir: Path, run_id: str, resume: bool):
        self.run_dir = run_dir
        self.run_id = run_id
        self.resume = resume
        self._fd: int | None = None
        self.created = False  # this process made the directory (a new run)

    def claim(self) -> None:
        """So an earlier run is never overwritten or merged into and two rig processes never share one directory."""
        import fcntl

        shown = self.run_dir
        if not self.resume:
            try:
                self.run_dir.parent.mkdir(parents=True, exist_ok=True)
                self.run_dir.mkdir()
                self.created = True
            except FileExistsError:
                if any(self.run_dir.iterdir()):
                    raise RunInputError(
                        f"{shown} already exists (run id {self.run_id!r} was used before); "
                        f"choose another --run-id, or continue that run with: rig sweep --resume "
                        f"{shown}"
                    ) from None
            except OSError as e:
                raise RunError(f"cannot write results to {shown}: {e.strerror or e}") from None
        try:
            fd = os.open(self.run_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunError(f"cannot write results to {shown}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RunInputError(
                f"{shown} is in use by another rig process (pid {holder}); wait for it to end or "
                f"choose another --run-id"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        if not self.resume and (self.run_dir / "manifest.json").exists():  # another run claimed it just before us
            self.release()
            raise RunInputError(
                f"{shown} already exists (run id {self.run_id!r} was used before); choose "
                f"another --run-id, or continue that run with: rig sweep --resume {shown}"
            )

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def discard_if_empty(self) -> None:
        """Remove the directory this run made when it holds nothing but the lock (the run stopped before writing
        anything: the disk check, Ray's start): an empty run directory is no run, and would only take its id."""
        if not self.created or self._fd is not None:
            return
        with contextlib.suppress(OSError):
            if {p.name for p in self.run_dir.iterdir()} <= {".lock", ".write-probe"}:
                shutil.rmtree(self.run_dir)


def check_output(run_dir: Path) -> None:
    """Refuse to start when results cannot be written there or the disk is nearly full."""
    try:
        probe = run_dir / ".write-probe"
        probe.write_bytes(b"x" * 4096)
        probe.unlink()
    except OSError as e:
        raise RunError(f"cannot write results to {run_dir}: {e.strerror or e}") from None
    free = shutil.disk_usage(run_dir).free
    if free < 64 * 2**20:
        raise RunError(f"only {free / 2**20:.0f} MiB free at {run_dir}; need at least 64 MiB")


def supersede(run_dir: Path, pid: str) -> None:
    """Before (re)running a point, move any rows of an earlier attempt aside (no duplicates): its requests, server
    metrics and GPU samples (an earlier server's energy counter mixed into the new one's ran backwards, and the
    point's energy fell back to integrating both attempts' power)."""
    for sub in (REQUESTS_DIR, SERVER_METRICS_DIR, GPU_METRICS_DIR):
        old = run_dir / sub / f"point={pid}"
        if old.exists():
            dest = run_dir / "superseded" / time.strftime("%Y%m%d-%H%M%S") / sub / f"point={pid}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(old, dest)


def log_traceback(run_dir: Path, pid: str) -> Path:
    """Append the exception being handled to logs/driver.log under the point's name; return the log's path."""
    log = run_dir / "logs" / "driver.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} point {pid}\n{traceback.format_exc()}\n")
    return log
