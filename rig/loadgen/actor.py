"""The LoadGenerator Ray actor: one event loop on one client host, driving its share of each point."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from rig.contracts import GeneratorInfo, GeneratorProgress, GeneratorReport, HostCorpus
from rig.loadgen import spool
from rig.loadgen.drive import PointRun, make_session
from rig.loadgen.open_loop import Http
from rig.loadgen.plan import GeneratorPlan
from rig.results import requests_dir

if TYPE_CHECKING:
    from rig.workloads.spec import WorkloadSpec


class LoadGenerator:
    """Async actor. Methods run on one event loop, so ``progress`` is served while ``run_point`` works."""

    def __init__(self, generator: int, out_root: str, spool_root: str | None = None):
        self.generator = generator
        self.out_root = Path(out_root)
        self.host = socket.gethostname()
        try:
            self.node_ip = ray.util.get_node_ip_address()
            self.node_id: str | None = ray.get_runtime_context().get_node_id()
        except Exception:  # outside Ray (tests)
            self.node_ip, self.node_id = "127.0.0.1", None
        # Where part files are written on this host: the results dir itself when it is shared/local,
        # else a local spool ({host}, {node_ip}, {node_id} filled in) the driver gathers from at the end.
        self.spool_root = Path(self._fill(spool_root)) if spool_root else self.out_root
        self.shipper: spool.Shipper | None = None  # copies closed parts to a shared URI as they appear
        self.clock_offset_s = 0.0
        self._http: Http | None = None
        self._current: PointRun | None = None
        self._task: asyncio.Task | None = None
        self._warm_task: asyncio.Task | None = None  # the warm-up in progress (stop cancels it)

    def _fill(self, template: str) -> str:
        return spool.fill(template, self.host, self.node_ip, self.node_id)

    async def info(self) -> GeneratorInfo:
        return GeneratorInfo(
            generator=self.generator,
            host=self.host,
            node_ip=self.node_ip,
            node_id=self.node_id,
            pid=os.getpid(),
            spool_root=str(self.spool_root),
        )

    async def sees(self, path: str, token: str) -> bool:
        """Whether this host sees the driver's file at ``path`` holding ``token`` (same host or a shared FS)."""
        try:
            return Path(path).read_text() == token
        except OSError:
            return False

    async def set_output(self, root: str, ship_uri: str | None = None) -> str | None:
        """Write part files under ``root`` (a template filled for this host); with ``ship_uri``, also copy each
        closed part there as it appears. Returns None, or why this host cannot write there."""
        self.spool_root = Path(self._fill(root))
        self.shipper = spool.Shipper(self.spool_root, ship_uri) if ship_uri else None
        problem = await self.can_write()
        if problem is None and self.shipper is not None:
            problem = await asyncio.to_thread(self.shipper.check)
        return problem

    async def corpus(self, workloads: list[WorkloadSpec]) -> HostCorpus:
        """Fingerprints of the source trees this host's prompts would quote (see rig.workloads.corpus_fingerprints),
        or why it cannot read them."""
        from rig.workloads import WorkloadError, corpus_fingerprints

        try:
            found = await asyncio.to_thread(corpus_fingerprints, workloads)
        except (WorkloadError, OSError) as e:
            return HostCorpus(error=str(e))
        return HostCorpus.model_validate({"fingerprints": found})

    async def clock(self) -> float:
        return time.time()

    async def set_clock_offset(self, offset_s: float) -> None:
        self.clock_offset_s = offset_s

    async def can_write(self) -> str | None:
        """None if the spool is writable here, else why not (checked before a run starts)."""
        try:
            self.spool_root.mkdir(parents=True, exist_ok=True)
            probe = self.spool_root / f".probe-{self.generator}-{os.getpid()}"
            probe.write_bytes(b"x")
            probe.unlink()
            return None
        except OSError as e:
            return f"{self.spool_root}: {e.strerror or e}"

    async def prepare(self, plan: GeneratorPlan) -> int:
        """Open the HTTP session and send the plan's warm-up requests (not recorded)."""
        if self._http is None or self._http.closed:
            self._http = make_session()
        self._current = PointRun(plan, self.spool_root, self.host, self.clock_offset_s)
        # A task of its own, so that ``stop`` can cancel it: a server that stalls mid-stream would otherwise hold
        # the warm-up (and the run's Ctrl-C) for the request timeout (3,600 s by default).
        self._warm_task = asyncio.get_running_loop().create_task(self._current.warmup(self._http))
        try:
            return await asyncio.shield(self._warm_task)
        except asyncio.CancelledError:  # stopped (stop(), or this call cancelled): no warm-up request goes on
            self._warm_task.cancel()
            return self._current.warm_ok  # what succeeded before (nothing of a warm-up is recorded)
        finally:
            self._warm_task = None

    async def run_point(self, start_wall: float) -> GeneratorReport:
        """Start at the common wall-clock time ``start_wall`` (driver clock) and drive the prepared point."""
        assert self._current is not None and self._http is not None, "prepare() first"
        notice = start_wall + self.clock_offset_s - time.time()  # how long before the start the call came
        start_mono = time.perf_counter() + notice
        current = self._current
        task = self._task = asyncio.get_running_loop().create_task(current.run(self._http, start_mono))
        shipping = asyncio.get_running_loop().create_task(self._ship_loop()) if self.shipper else None
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled():  # this call was cancelled, not the level
                raise
            # stopped before the level's first step: nothing was sent or recorded
            result = current.summary("interrupted", "stopped before the level started", {})
        finally:
            self._task = None
            if shipping is not None:
                shipping.cancel()
                await asyncio.gather(shipping, return_exceptions=True)
        if self.shipper is not None:
            await asyncio.to_thread(self.shipper.ship, self._rel_dir())  # the last parts, closed by run()
            result = result.model_copy(update=self.shipper.summary())
        return result.model_copy(update={"start_notice_s": notice})

    def _rel_dir(self) -> str:
        assert self._current is not None
        plan = self._current.plan
        return str(requests_dir(Path("."), plan.point.point, plan.generator))

    async def _ship_loop(self, every_s: float = 1.0) -> None:
        """Copy closed part files to the shared URI while the point runs (they survive this host)."""
        assert self.shipper is not None
        while True:
            await asyncio.sleep(every_s)
            await asyncio.to_thread(self.shipper.ship, self._rel_dir())

    async def stop(self) -> None:
        """Stop the running point (in-flight requests are recorded as cancelled, part files closed) or its warm-up."""
        if self._warm_task is not None and not self._warm_task.done():
            self._warm_task.cancel()
            await asyncio.gather(self._warm_task, return_exceptions=True)
        task, current = self._task, self._current
        if task is None or task.done() or current is None:
            return
        if current.ended_mono is not None:
            # The level has ended and its last part is being written: a cancel now would interrupt that wait while
            # the writer's thread goes on (run_point raised CancelledError, the driver counted the rows before the
            # part reached the disk and dropped this generator). Let the write finish instead.
            await asyncio.gather(asyncio.shield(task), return_exceptions=True)
            return
        # Rows already taken reach the disk first: cancelling thousands of requests on a swamped loop can take
        # longer than the driver waits before it kills this actor.
        with contextlib.suppress(OSError):
            await asyncio.to_thread(current.writer.flush)
        if not task.done() and current.ended_mono is None:
            task.cancel()
        await asyncio.gather(asyncio.shield(task), return_exceptions=True)

    async def progress(self) -> GeneratorProgress:
        """The running level's counters and latency sketches (the driver polls them for its progress and live view)."""
        if self._current is None:
            return GeneratorProgress(
                {"scheduled": 0, "ok": 0, "failed": 0, "cancelled": 0, "in_flight": 0, "tokens": 0}
            )
        return self._current.progress()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()


def remote_class(**options: Any) -> Any:  # a Ray actor class (ray ships no types)
    """The actor class with Ray options; never restarted (a silent restart would double-count load)."""
    return ray.remote(max_restarts=0, max_task_retries=0, **options)(LoadGenerator)
