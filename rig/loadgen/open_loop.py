"""The open loop's sender: each session's first turn sent at its arrival time, from the timer's own callback.

One synchronous callback, ``OpenLoop.pump``, does the sender's whole turn: it sends every request already due (lean
client: on an idle keep-alive connection, the send time is that write; a task then reads the response and makes the
record), builds the requests due in the next ``LOOKAHEAD_S`` (body and head as bytes) and arms the timerfd for the
next one -- so the sender never waits for a task step behind the loop's other work. A read or a record that finds a
send due runs the pump first (``Pacer.run_due``); flush steps and young GC wait for a gap in the schedule. A request
that finds no idle connection, and every request of the aiohttp client, is sent by its task (connect, write). With
the concurrency cap full a due send waits for a slot (the pump runs again when one frees), and the wait shows up as
slip.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

import aiohttp

from rig.config import Timeouts
from rig.loadgen import http1
from rig.loadgen.apis import Api
from rig.loadgen.client import LeanRequest
from rig.loadgen.flush import Flusher
from rig.loadgen.gc_gaps import GapCollector
from rig.loadgen.pacer import Pacer
from rig.loadgen.plan import GeneratorPlan
from rig.workloads.base import Session, Turn

Http: TypeAlias = http1.Pool | aiohttp.ClientSession

LEVEL_FAILED = "cancelled: the level stopped on an internal error"  # what its in-flight requests record
LOOKAHEAD_S = 0.002  # requests due this soon are built before the timer fires
MAX_AHEAD = 64  # ... but never more than this many at once
MAX_BURST = 16  # behind schedule: sends in a row before the reads get a turn
SWITCH_INTERVAL_S = 0.0005  # the longest another thread may keep the GIL from the loop (CPython: 5 ms)
WARM_LOW = 16  # lean client: whenever fewer connections are idle, up to WARM_REFILL more (a send that finds none
WARM_REFILL = 32  # connects on its task, behind every read of that turn of the loop: tens of ms when the loop is busy)


def host_port(url: str) -> tuple[str, int] | None:
    """(host, port) of a URL the lean client speaks, else None."""
    try:
        host, port, _ = http1.split_url(url)
    except ValueError:
        return None
    return host, port


@dataclass(eq=False)
class Due:
    """One session of the open loop, its first request built ahead of its due time (None: aiohttp)."""

    session: Session
    due: float
    request: LeanRequest | None = field(default=None)


class PointRun(Protocol):
    """What the open loop uses of its point's run (rig.loadgen.drive.PointRun: sessions, records, part files)."""

    plan: GeneratorPlan
    api: Api
    timeouts: Timeouts
    headers: dict[str, str]
    unreachable: bool  # connections refused in a row: no more sessions start
    cancel_reason: str  # what a request cancelled in flight records
    flusher: Flusher

    def set_pacer(self, pacer: Pacer | None) -> None: ...

    def _cancelled_before_start(self, item: Due) -> None: ...

    async def _run_session(
        self, http: Http, session: Session, intended: float, deadline: float | None, first: LeanRequest | None = None
    ) -> None: ...


class OpenLoop:
    """One level of the open loop: the sender's state, its turn (``pump``) and the tasks it starts."""

    def __init__(self, run: PointRun, http: Http, start: float) -> None:
        plan = run.plan
        assert plan.arrivals is not None
        self.run = run
        self.http = http
        self.start = start
        self.slots = plan.slots or 0
        self.deadline = start + plan.duration_s if plan.duration_s else None
        self.loop = asyncio.get_running_loop()
        self.tasks: set[asyncio.Task[None]] = set()
        self.unstarted: set[Due] = set()  # launched, task not yet running: recorded here if cancelled before it runs
        self.ahead: deque[Due] = deque()  # built, not yet due
        self.busy = 0  # sessions holding a slot
        self.waiting = False  # the cap is full and a send is due: the next freed slot runs the pump
        self.more = True  # arrivals left to build
        self.arrivals: Iterator[tuple[Session, float]] = zip(plan.sessions, plan.arrivals, strict=False)
        self.failures: list[BaseException] = []  # a session task's unexpected exception: it ends the level
        self.pacer = Pacer()
        self.collector = GapCollector()
        self.refill: asyncio.Task[int] | None = None  # lean client: idle connections being opened
        self.pool = http if isinstance(http, http1.Pool) else None
        self.addr = host_port(plan.url) if self.pool is not None else None
        # every arrival handed to a task, or sending stopped (or the pump failed)
        self.finished: asyncio.Future[None] = self.loop.create_future()

    # ------------------------------------------------------------------ the level
    async def drive(self) -> None:
        """Send every arrival, wait for its session; stopped or failed, every request in flight is recorded."""
        if self.pool is not None:
            self.pool.preempt = self.pacer
        self.run.set_pacer(self.pacer)
        self.collector.start()
        # The part writer's thread holds the GIL between its native calls; asked for it back, CPython lets it keep it
        # for the switch interval (5 ms by default), and a send due meanwhile waits that long.
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, SWITCH_INTERVAL_S))
        try:
            self.pump()
            await self.finished
            self.pacer.disarm()
            while self.tasks and not self.failures:
                await asyncio.wait(set(self.tasks), return_when=asyncio.FIRST_EXCEPTION)
            if self.failures:
                raise self.failures[0]
        except BaseException as e:  # stopped, or the level failed: every request in flight is cancelled, recorded
            await self._cancel_all(e)
            raise
        finally:
            sys.setswitchinterval(switch)
            self._restore()

    async def _cancel_all(self, e: BaseException) -> None:
        if not isinstance(e, asyncio.CancelledError):
            self.run.cancel_reason = LEVEL_FAILED
        if not self.finished.done():
            self.finished.cancel()  # the pump sends nothing more
        self.pacer.disarm()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for item in self.unstarted:  # sent (or due) but cancelled before its task ran: still a record
            self.run._cancelled_before_start(item)

    def _restore(self) -> None:
        """The pool, the writer and the collector as they were before the level."""
        if not self.finished.done():
            self.finished.cancel()
        self.collector.stop()
        if self.refill is not None and not self.refill.done():
            self.refill.cancel()
        self.run.set_pacer(None)
        self.run.flusher.sent()
        if self.pool is not None and self.pool.preempt is self.pacer:
            self.pool.preempt = None
        self.pacer.close()

    # ------------------------------------------------------------------ the sender's turn
    def pump(self) -> None:
        """Send what is due, build what is due soon, arm the timer for the next (no await in here)."""
        if self.finished.done():
            return
        self.waiting = False
        try:
            if self._send_due():
                self.finished.set_result(None)
        except Exception as e:  # e.g. a request that cannot be built: the level fails with it, never silently
            self.finished.set_exception(e)
        finally:
            self.run.flusher.sent()

    def _send_due(self) -> bool:
        """The sends due now (at most ``MAX_BURST``); True once nothing more will be sent."""
        run, ahead, pacer, pool, slots = self.run, self.ahead, self.pacer, self.pool, self.slots
        sent = 0
        while not run.unreachable:
            if not ahead:
                self._build()
                if not ahead:
                    return True  # the schedule is done
            if ahead[0].due > time.perf_counter():
                self._build()  # top the lookahead up after the sends, then sleep until the next one
                pacer.arm(ahead[0].due, self.pump)
                self.collector.collect(ahead[0].due - time.perf_counter())  # a young collection, if it fits
                return False
            if slots and self.busy >= slots:
                self.waiting = True  # the cap is full: the sender waits for a slot
                return False
            if sent == MAX_BURST:  # behind schedule: the reads ready now get a turn, then the rest
                pacer.arm(ahead[0].due, self.pump)
                return False
            self._launch(ahead.popleft())
            sent += 1
            if pool is not None and self.addr is not None:
                self._keep_warm(pool, self.addr)
        return True

    def _build(self) -> None:
        """The requests due within ``LOOKAHEAD_S`` built ahead (at most ``MAX_AHEAD``)."""
        ahead, deadline, pool = self.ahead, self.deadline, self.pool
        now = time.perf_counter()
        while self.more and (not ahead or ahead[-1].due <= now + LOOKAHEAD_S) and len(ahead) < MAX_AHEAD:
            nxt = next(self.arrivals, None)
            due = self.start + nxt[1] if nxt is not None else 0.0
            if nxt is None or (deadline is not None and due >= deadline):
                self.more = False
                return
            turn = nxt[0].turns[0]
            ahead.append(Due(nxt[0], due, self._build_ahead(pool, turn) if pool is not None else None))

    def _build_ahead(self, http: http1.Pool, turn: Turn) -> LeanRequest | None:
        """The request built before it is due; None if building it fails (its task then builds it again, and the
        failure becomes that request's record)."""
        run = self.run
        try:
            return LeanRequest(http, run.plan.url, run.api, turn, [], run.plan.model, run.timeouts, run.headers)
        except Exception:
            return None

    def _keep_warm(self, pool: http1.Pool, addr: tuple[str, int]) -> None:
        """Lean client: idle connections below WARM_LOW are topped up by a task, off the sender's path."""
        refill = self.refill
        if refill is not None and (
            not refill.done() or refill.cancelled() or refill.exception() is not None or refill.result() == 0
        ):
            return  # one refill at a time; none after one that could open nothing (each request will say why)
        if pool.idle(*addr) < WARM_LOW and not (self.slots and pool.size >= self.slots):
            self.refill = self.loop.create_task(pool.warm(*addr, WARM_REFILL, self.run.timeouts.connect_s))

    # ------------------------------------------------------------------ the sessions' tasks
    def _launch(self, item: Due) -> None:
        if item.request is not None:
            item.request.send_now()  # no idle connection: its task connects and writes
        self.busy += 1
        task = self.loop.create_task(self._fire(item))
        self.unstarted.add(item)
        self.tasks.add(task)
        task.add_done_callback(self._settled)

    async def _fire(self, item: Due) -> None:
        self.unstarted.discard(item)
        try:
            await self.run._run_session(self.http, item.session, item.due, self.deadline, item.request)
        finally:
            self.busy -= 1
            if self.waiting:
                self.pump()

    def _settled(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            self.failures.append(exc)
            if not self.finished.done():
                self.finished.set_result(None)  # the level has failed: nothing more is sent
