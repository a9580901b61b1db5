"""Drive one point on one generator: closed loop by slots or open loop by arrival times; every request a record.

Pure asyncio, no Ray: the Ray actor (actor.py) wraps it, tests drive it directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from rig.contracts import GeneratorReport, GeneratorStatus, RecordCounts, achieved_rate, check_record, repair_record
from rig.loadgen import http1
from rig.loadgen.apis import api_for
from rig.loadgen.client import LeanRequest, Outcome, request_fields, reuse_trace, stream_request, unexpected_error
from rig.loadgen.gc_gaps import GapCollector
from rig.loadgen.health import LoopMonitor
from rig.loadgen.pacer import Pacer
from rig.loadgen.plan import GeneratorPlan
from rig.results import REQUEST_SCHEMA, PartWriter, empty_record, requests_dir
from rig.workloads.base import Session, Turn

Http = "http1.Pool | aiohttp.ClientSession"
_log = logging.getLogger(__name__)
LEVEL_FAILED = "cancelled: the level stopped on an internal error"  # what its in-flight requests record
UNREACHABLE_AFTER = 3  # consecutive refused connections after which a generator stops starting sessions
FREE_SLICE = 128  # written rows released per step of the loop (~0.2 ms)
FLUSH_GAP_S = 0.0005  # open loop: a flush step starts only when no send is due within this ...
GAP_WAIT_MAX_S = 0.005  # ... or once it has waited this long for such a gap (a dense schedule still gets written)
LOOKAHEAD_S = 0.002  # open loop: requests due this soon are built before the timer fires
MAX_AHEAD = 64  # ... but never more than this many at once
GC_BEFORE_START_S = 0.5  # a full collection before the level if at least this long remains before its start
WRITER_NICE = 19  # the part writer's thread: the lowest CPU priority, so the sender never waits behind it
MAX_BURST = 16  # open loop behind schedule: sends in a row before the reads get a turn
OPEN_LOOP_EARLY_S = 0.010  # the open loop's sender starts this long before the level (nothing is sent early)
SWITCH_INTERVAL_S = 0.0005  # open loop: the longest another thread may keep the GIL from the loop (CPython: 5 ms)
WARM_MAX = 32  # open loop, lean client: idle connections opened before the level starts
WARM_LOW = 16  # ... and during it, whenever fewer are idle, up to WARM_REFILL more (a send that finds none connects
WARM_REFILL = 32  # on its task, behind every read of that turn of the loop: tens of ms when the loop is busy)


HTTP_CLIENT_ENV = "RIG_HTTP_CLIENT"  # "lean" (default) or "aiohttp"


def make_session(kind: str | None = None) -> http1.Pool | aiohttp.ClientSession:
    """One HTTP client per generator: the lean HTTP/1.1 client (default) or aiohttp, behind one interface.

    Neither caps connections below the concurrency (aiohttp's default cap of 100 is lifted).
    """
    kind = kind or os.environ.get(HTTP_CLIENT_ENV) or "lean"
    if kind == "lean":
        return http1.Pool()
    if kind != "aiohttp":
        raise ValueError(f"{HTTP_CLIENT_ENV} must be 'lean' or 'aiohttp', not {kind!r}")
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300, force_close=False)
    # A large read buffer: a 64 KiB buffer throttles long streamed responses (vLLM #39963). The trace marks a request
    # sent on a reused keep-alive connection, which the client may send once more (client.py::_post).
    return aiohttp.ClientSession(connector=connector, read_bufsize=2**20, trace_configs=[reuse_trace()])


def _lower_priority() -> None:
    """The part writer's thread at the lowest priority: on a shared core the event loop always goes first.

    Encoding a part took 120 ms of wall time at 2,000 req/s; at equal priority the scheduler shared the core with
    it and sends due meanwhile slipped by milliseconds. Linux takes a thread id here (elsewhere: left as it is).
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)


def _freeze_heap(start_mono: float) -> None:
    """Move every object alive before the level out of the GC's reach until it ends (``gc.unfreeze``).

    A full collection walks every tracked object: with the imports and the point's sessions that took 50-80 ms
    (650 ms in a backlog), a stall of the loop that every send due meanwhile shows as slip. Frozen, a collection
    during the level walks only what the level made. Garbage is collected first if there is time before the start.
    """
    if start_mono - time.perf_counter() > GC_BEFORE_START_S:
        gc.collect()
    gc.freeze()


def _host_port(url: str) -> tuple[str, int] | None:
    """(host, port) of a URL the lean client speaks, else None."""
    try:
        host, port, _ = http1.split_url(url)
    except ValueError:
        return None
    return host, port


@dataclass(eq=False)
class _Due:
    """One session of the open loop, its first request built ahead of its due time (None: aiohttp)."""

    session: Session
    due: float
    request: LeanRequest | None = field(default=None)


class PointRun:
    """State of one generator's share of one point."""

    def __init__(self, plan: GeneratorPlan, out_root: Path | str, host: str, clock_offset_s: float):
        self.plan = plan
        self.api = api_for(plan.point.api, plan.dialect)
        self.host = host
        self.clock_offset_s = clock_offset_s
        self.writer = PartWriter(
            requests_dir(Path(out_root), plan.point.point, plan.generator), REQUEST_SCHEMA, repair=self._repaired
        )
        self.timeouts = plan.timeouts
        self.headers = dict(plan.extra_headers)
        self.counts = {
            "scheduled": 0,
            "ok": 0,
            "failed": 0,
            "cancelled": 0,
            "in_flight": 0,
            "tokens": 0,
            "ended_early": 0,
            "tokens_estimated": 0,
        }
        self.slips: list[float] = []
        self._refused = 0  # consecutive connection failures
        self.unreachable = False
        self.first_sends: list[tuple[float, float]] = []  # (intended, actual) of each session's first turn
        self.send_span = [float("inf"), float("-inf")]  # first and last send of every record (achieved_rate)
        self._anchor_wall = time.time()
        self._anchor_mono = time.perf_counter()
        self._common = {
            **plan.point.columns(),
            "generator": plan.generator,
            "host": host,
            "clock_offset_s": clock_offset_s,
        }
        self.started_mono: float | None = None
        self.ended_mono: float | None = None
        self.cancel_reason = "cancelled: the run was stopped"  # what a cancelled in-flight request records
        self.warm_ok = 0  # warm-up requests that succeeded so far
        self._parts = ThreadPoolExecutor(1, thread_name_prefix="rig-parts", initializer=_lower_priority)
        self._pacer: Pacer | None = None  # the open loop's sender while it runs: other work lets due sends go first
        self._gap_waiters: list[asyncio.Future] = []  # flush steps waiting for a gap in the schedule

    def wall(self, mono: float) -> float:
        """Wall-clock time derived from the monotonic clock and one anchor (no NTP steps mid-run)."""
        return self._anchor_wall + (mono - self._anchor_mono)

    # ---------------------------------------------------------------- records
    def _record(self, session: Session, j: int, turn: Turn, intended: float, out: Outcome, sent: bool = True) -> None:
        """``sent=False``: a turn never sent; it has no send time or slip, so rates and slip percentiles skip it."""
        pacer = self._pacer
        if pacer is not None and time.perf_counter_ns() >= pacer.due_ns:
            pacer.run_due()  # a send came due while records were queued: it goes first
        rec = empty_record()
        rec.update(self._common)
        rec.update(request_fields(turn, out))
        rec["session_id"] = session.session_id
        rec["turn"] = j
        if sent:
            rec["intended_send_ts"] = self.wall(intended)
            rec["send_ts"] = self.wall(out.send_mono)
            rec["slip_s"] = out.send_mono - intended
            rec["e2e_from_intended_s"] = out.end_mono - intended
        rec["first_token_ts"] = self.wall(out.first_mono) if out.first_mono is not None else None
        rec["end_ts"] = self.wall(out.end_mono)
        check_record(rec)  # a key that is not a column would vanish from the Parquet silently
        tokens = int(rec["completion_tokens"] or 0) if out.status == "ok" else 0
        self.counts[out.status] += 1
        self.writer.add(rec)  # nothing below raises: a record is added and counted, or neither
        if out.status == "failed" and (out.error or "").startswith("connect:"):
            self._refused += 1
            if self._refused >= UNREACHABLE_AFTER:
                self.unreachable = True  # stop starting sessions: a dead server would get a storm of records
        elif out.status == "ok":
            self._refused = 0
            # A fixed length asked for (ignore_eos) and not had: a dialect without ignore_eos, or a server that
            # stopped anyway. Said in the point's flags, never made up.
            if turn.ignore_eos and (out.state.finish_reason == "stop" or tokens < turn.max_tokens):
                self.counts["ended_early"] += 1
            if out.state.tokens_source == "chunks":
                self.counts["tokens_estimated"] += 1
        self.counts["tokens"] += tokens
        if not sent:
            return
        self.slips.append(out.send_mono - intended)
        span = self.send_span
        if out.send_mono < span[0]:
            span[0] = out.send_mono
        if out.send_mono > span[1]:
            span[1] = out.send_mono
        if j == 0:
            self.first_sends.append((intended, out.send_mono))

    def _repaired(self, row: dict[str, Any]) -> None:
        """A record the part writer could not convert: written as a failed one (``repair_record``), counted so."""
        was, tokens = row.get("status"), row.get("completion_tokens")
        error = repair_record(row)
        if was in ("ok", "cancelled"):
            self.counts[str(was)] -= 1
            self.counts["failed"] += 1
        if was == "ok":
            self.counts["tokens"] -= int(tokens or 0)  # as _record counted it
        _log.warning(
            "point %s, generator %d: request %s repaired: %s",
            self.plan.point.point,
            self.plan.generator,
            row.get("request_id"),
            error,
        )

    def _record_or_fail(self, session: Session, j: int, turn: Turn, intended: float, out: Outcome) -> Outcome:
        """Record a turn; an outcome that does not make a record (a bug) is recorded as that turn's failure."""
        try:
            self._record(session, j, turn, intended, out)
            return out
        except Exception as e:
            _log.warning("request %s: its record could not be made", turn.request_id, exc_info=e)
            failed = Outcome(
                send_mono=out.send_mono,
                end_mono=out.end_mono,
                http_status=out.http_status,
                status="failed",
                error=unexpected_error(e),
            )
            self._record(session, j, turn, intended, failed)
            return failed

    def _skip(self, session: Session, j: int, turn: Turn, why: str) -> None:
        """A scheduled turn that was never sent (earlier turn failed, level ended): recorded as cancelled."""
        now = time.perf_counter()
        out = Outcome(send_mono=now, end_mono=now, status="cancelled", error=why)
        self._record(session, j, turn, now, out, sent=False)

    # ---------------------------------------------------------------- sending
    async def _run_session(
        self, http: Http, session: Session, intended: float, deadline: float | None, first: LeanRequest | None = None
    ) -> None:
        """Every turn of one session, each a record; ``first``: the first turn, built ahead (and maybe sent)."""
        history: list[dict[str, str]] = []
        self.counts["scheduled"] += session.n_requests
        for j, turn in enumerate(session.turns):
            if j > 0:
                if deadline is not None and time.perf_counter() + turn.think_time_s >= deadline:
                    for k in range(j, session.n_requests):
                        self._skip(session, k, session.turns[k], "not sent: the level's duration ended")
                    return
                if turn.think_time_s > 0:
                    try:
                        await asyncio.sleep(turn.think_time_s)
                    except asyncio.CancelledError:  # its remaining turns were scheduled: record them
                        for k in range(j, session.n_requests):
                            self._skip(session, k, session.turns[k], f"not sent: {self.cancel_reason}")
                        raise
                intended = time.perf_counter()
            self.counts["in_flight"] += 1
            try:
                if j == 0 and first is not None:
                    out = await first.run()
                else:
                    out = await stream_request(
                        http, self.plan.url, self.api, turn, history, self.plan.model, self.timeouts, self.headers
                    )
            except asyncio.CancelledError:
                now = time.perf_counter()
                self._record(
                    session,
                    j,
                    turn,
                    intended,
                    Outcome(send_mono=min(intended, now), end_mono=now, status="cancelled", error=self.cancel_reason),
                )
                for k in range(j + 1, session.n_requests):
                    self._skip(session, k, session.turns[k], f"not sent: {self.cancel_reason}")
                raise
            except Exception as e:  # the clients map every fault: one that escapes is a bug, this turn's failure
                now = time.perf_counter()
                out = Outcome(send_mono=min(intended, now), end_mono=now, status="failed", error=unexpected_error(e))
                _log.warning("request %s failed on an unexpected exception", turn.request_id, exc_info=e)
            finally:
                self.counts["in_flight"] -= 1
            out = self._record_or_fail(session, j, turn, intended, out)
            if out.status != "ok":
                for k in range(j + 1, session.n_requests):
                    self._skip(session, k, session.turns[k], f"not sent: turn {j} failed")
                return
            history = [*history, *turn.messages, {"role": "assistant", "content": out.state.reply}]

    async def _closed_loop(self, http: Http, start: float) -> None:
        todo = self.plan.session_iter()
        deadline = start + self.plan.duration_s if self.plan.duration_s else None

        async def slot() -> None:
            for session in todo:  # one shared iterator: each session goes to the first free slot
                await asyncio.sleep(0)  # building sessions is synchronous: let a stop (or the flusher) in between
                now = time.perf_counter()
                if (deadline is not None and now >= deadline) or self.unreachable:
                    return
                await self._run_session(http, session, now, deadline)

        slots = [asyncio.ensure_future(slot()) for _ in range(max(1, self.plan.slots or 1))]
        try:
            await asyncio.gather(*slots)
        except BaseException as e:  # stopped, or one slot failed: the others' requests are cancelled and recorded
            if not isinstance(e, asyncio.CancelledError):
                self.cancel_reason = LEVEL_FAILED
            for t in slots:
                t.cancel()
            await asyncio.gather(*slots, return_exceptions=True)
            raise

    async def _open_loop(self, http: Http, start: float) -> None:
        """Send each session's first turn at its arrival time, from the timer's own callback.

        One synchronous callback, ``pump``, does the sender's whole turn: it sends every request already due (lean
        client: on an idle keep-alive connection, the send time is that write; a task then reads the response and
        makes the record), builds the requests due in the next ``LOOKAHEAD_S`` (body and head as bytes) and arms
        the timerfd for the next one -- so the sender never waits for a task step behind the loop's other work. A
        read or a record that finds a send due runs the pump first (``Pacer.run_due``); flush steps and young GC
        wait for a gap in the schedule. A request that finds no idle connection, and every request of the aiohttp
        client, is sent by its task (connect, write). With the concurrency cap full a due send waits for a slot
        (the pump runs again when one frees), and the wait shows up as slip.
        """
        assert self.plan.arrivals is not None
        slots = self.plan.slots or 0
        deadline = start + self.plan.duration_s if self.plan.duration_s else None
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task] = set()
        unstarted: set[_Due] = set()  # launched, task not yet running: recorded here if cancelled before it runs
        ahead: deque[_Due] = deque()  # built, not yet due
        busy = 0  # sessions holding a slot
        waiting = False  # the cap is full and a send is due: the next freed slot runs the pump
        more = True  # arrivals left to build
        arrivals = zip(self.plan.sessions, self.plan.arrivals)
        failures: list[BaseException] = []  # a session task's unexpected exception: it ends the level
        pacer = Pacer()
        collector = GapCollector()
        refill: asyncio.Task | None = None  # lean client: idle connections being opened
        pool = http if isinstance(http, http1.Pool) else None
        addr = _host_port(self.plan.url) if pool is not None else None
        finished = loop.create_future()  # every arrival handed to a task, or sending stopped (or the pump failed)

        async def fire(item: _Due) -> None:
            nonlocal busy
            unstarted.discard(item)
            try:
                await self._run_session(http, item.session, item.due, deadline, item.request)
            finally:
                busy -= 1
                if waiting:
                    pump()

        def build() -> None:
            """The requests due within ``LOOKAHEAD_S`` built ahead (at most ``MAX_AHEAD``)."""
            nonlocal more
            now = time.perf_counter()
            while more and (not ahead or ahead[-1].due <= now + LOOKAHEAD_S) and len(ahead) < MAX_AHEAD:
                nxt = next(arrivals, None)
                due = start + nxt[1] if nxt is not None else 0.0
                if nxt is None or (deadline is not None and due >= deadline):
                    more = False
                    return
                turn = nxt[0].turns[0]
                ahead.append(_Due(nxt[0], due, self._build_ahead(pool, turn) if pool is not None else None))

        def keep_warm() -> None:
            """Lean client: idle connections below WARM_LOW are topped up by a task, off the sender's path."""
            nonlocal refill
            assert pool is not None and addr is not None
            if refill is not None and (
                not refill.done() or refill.cancelled() or refill.exception() is not None or refill.result() == 0
            ):
                return  # one refill at a time; none after one that could open nothing (each request will say why)
            if pool.idle(*addr) < WARM_LOW and not (slots and pool.size >= slots):
                refill = loop.create_task(pool.warm(*addr, WARM_REFILL, self.timeouts.connect_s))

        def launch(item: _Due) -> None:
            nonlocal busy
            if item.request is not None:
                item.request.send_now()  # no idle connection: its task connects and writes
            busy += 1
            task = loop.create_task(fire(item))
            unstarted.add(item)
            tasks.add(task)
            task.add_done_callback(settled)

        def settled(task: asyncio.Task) -> None:
            tasks.discard(task)
            exc = None if task.cancelled() else task.exception()
            if exc is not None:
                failures.append(exc)
                if not finished.done():
                    finished.set_result(None)  # the level has failed: nothing more is sent

        def pump() -> None:
            """Send what is due, build what is due soon, arm the timer for the next (no await in here)."""
            nonlocal waiting
            if finished.done():
                return
            waiting = False
            try:
                sent = 0
                while not self.unreachable:
                    if not ahead:
                        build()
                        if not ahead:
                            break  # the schedule is done
                    if ahead[0].due > time.perf_counter():
                        build()  # top the lookahead up after the sends, then sleep until the next one
                        pacer.arm(ahead[0].due, pump)
                        collector.collect(ahead[0].due - time.perf_counter())  # a young collection, if it fits
                        return
                    if slots and busy >= slots:
                        waiting = True  # the cap is full: the sender waits for a slot
                        return
                    if sent == MAX_BURST:  # behind schedule: the reads ready now get a turn, then the rest
                        pacer.arm(ahead[0].due, pump)
                        return
                    launch(ahead.popleft())
                    sent += 1
                    if pool is not None and addr is not None:
                        keep_warm()
                finished.set_result(None)
            except Exception as e:  # e.g. a request that cannot be built: the level fails with it, never silently
                finished.set_exception(e)
            finally:
                self._sent()

        if pool is not None:
            pool.preempt = pacer
        self._pacer = pacer
        collector.start()
        # The part writer's thread holds the GIL between its native calls; asked for it back, CPython lets it keep it
        # for the switch interval (5 ms by default), and a send due meanwhile waits that long.
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, SWITCH_INTERVAL_S))
        try:
            pump()
            await finished
            pacer.disarm()
            while tasks and not failures:
                await asyncio.wait(set(tasks), return_when=asyncio.FIRST_EXCEPTION)
            if failures:
                raise failures[0]
        except BaseException as e:  # stopped, or the level failed: every request in flight is cancelled, recorded
            if not isinstance(e, asyncio.CancelledError):
                self.cancel_reason = LEVEL_FAILED
            if not finished.done():
                finished.cancel()  # the pump sends nothing more
            pacer.disarm()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for item in unstarted:  # sent (or due) but cancelled before its task ran: still a record
                self._cancelled_before_start(item)
            raise
        finally:
            if not finished.done():
                finished.cancel()
            collector.stop()
            sys.setswitchinterval(switch)
            if refill is not None and not refill.done():
                refill.cancel()
            self._pacer = None
            self._sent()
            if pool is not None and pool.preempt is pacer:
                pool.preempt = None
            pacer.close()

    def _build_ahead(self, http: http1.Pool, turn: Turn) -> LeanRequest | None:
        """The open loop's request built before it is due; None if building it fails (its task then builds it
        again, and the failure becomes that request's record)."""
        try:
            return LeanRequest(http, self.plan.url, self.api, turn, [], self.plan.model, self.timeouts, self.headers)
        except Exception:
            return None

    def _cancelled_before_start(self, item: _Due) -> None:
        session, now = item.session, time.perf_counter()
        self.counts["scheduled"] += session.n_requests
        sent = item.request is not None and item.request.out is not None  # written by the timer's callback
        send = item.request.out.send_mono if sent else now
        if item.request is not None:
            item.request.abandon()
        self._record(
            session,
            0,
            session.turns[0],
            item.due,
            Outcome(send_mono=send, end_mono=now, status="cancelled", error=self.cancel_reason),
            sent=sent,
        )
        for k in range(1, session.n_requests):
            self._skip(session, k, session.turns[k], f"not sent: {self.cancel_reason}")

    async def _bounded(self, level: Any, start: float) -> None:
        """--duration bounds the level: requests still in flight ``grace_s`` after its end are cancelled and
        recorded as such (without a duration the level ends when its sessions do)."""
        if not self.plan.duration_s:
            await level
            return
        task = asyncio.ensure_future(level)
        end = start + self.plan.duration_s + self.plan.grace_s
        try:
            done, _ = await asyncio.wait({task}, timeout=max(0.0, end - time.perf_counter()))
        except asyncio.CancelledError:  # the run is stopped: cancel the level's requests, then stop
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        if done:
            task.result()
            return
        self.cancel_reason = f"cancelled: in flight {self.plan.grace_s:g}s after the level's duration ended"
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            try:
                await self._flush_due()
            except Exception as e:  # keep driving; rows stay buffered and the next flush (or the final write) retries
                self._write_failure(e, "a part file")

    def _write_failure(self, e: Exception, part: str) -> str:
        """The one line for a part file not written: disk full or unwritable (OSError), or rows even a repair cannot
        convert (a bug: logged with its traceback); the rows stay buffered either way."""
        if isinstance(e, OSError):
            why = f"cannot write part file: {e.strerror or e}"
            _log.warning("point %s, generator %d: %s: %s", self.plan.point.point, self.plan.generator, part, why)
        else:
            why = f"cannot write part file: {unexpected_error(e)}"
            _log.error(
                "point %s, generator %d: %s could not be made",
                self.plan.point.point,
                self.plan.generator,
                part,
                exc_info=e,
            )
        return why

    async def _flush_due(self) -> None:
        """Write a part if one is due, without stalling the sender: rows become an Arrow table one bounded piece at
        a time on the loop (``TableBuilder``: one column over a few hundred rows, ~0.1-0.2 ms; a conversion in a
        thread would hold the GIL, and the loop, for all of it), then the thread encodes and writes (pyarrow
        releases the GIL there), then the written rows are released a few at a time. In the open loop each step
        waits for a gap in the schedule (no send due within ``FLUSH_GAP_S``)."""
        rows = self.writer.take()
        if not rows:
            return
        try:
            builder = self.writer.builder(rows)  # a bad row is repaired, not lost
            while not builder.done:
                await self._gap(FLUSH_GAP_S)
                builder.step()
            table = builder.table()
        except BaseException:  # the level ended mid-flush (or a bug): the rows go back for the next or final write
            self.writer.untake(rows)
            raise
        del builder
        # Cancelled from here on, the thread still writes these rows, and the final write waits for it.
        await asyncio.get_running_loop().run_in_executor(self._parts, self.writer.write, rows, table)
        del table
        for end in range(len(rows), 0, -FREE_SLICE):  # releasing 5,000 records at once held the loop ~8 ms
            await self._gap(FLUSH_GAP_S)
            del rows[max(0, end - FREE_SLICE) : end]

    async def _gap(self, need_s: float) -> None:
        """Yield to the loop; then, in the open loop, wait until no send is due within ``need_s`` (at most
        ``GAP_WAIT_MAX_S``)."""
        await asyncio.sleep(0)  # the reads and the sends due get a turn between steps
        need = int(need_s * 1e9)
        give_up = time.perf_counter_ns() + int(GAP_WAIT_MAX_S * 1e9)
        while (pacer := self._pacer) is not None:
            now = time.perf_counter_ns()
            if pacer.due_ns - now >= need or now >= give_up:
                return
            waiter = asyncio.get_running_loop().create_future()
            self._gap_waiters.append(waiter)
            await waiter  # the sender's next turn ends: look again

    def _sent(self) -> None:
        """The sender's turn ended (or the level did): flush steps waiting for a gap look again."""
        waiters, self._gap_waiters = self._gap_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def warmup(self, http: Http) -> int:
        """Send the warm-up sessions; nothing is recorded. Returns how many succeeded (also kept in ``warm_ok``, for
        a warm-up that is cancelled)."""
        self.warm_ok = 0
        for session in self.plan.warmup:
            history: list[dict[str, str]] = []
            for turn in session.turns:
                out = await stream_request(
                    http, self.plan.url, self.api, turn, history, self.plan.model, self.timeouts, self.headers
                )
                self.warm_ok += out.status == "ok"
        return self.warm_ok

    async def _warm(self, http: http1.Pool, start_mono: float) -> None:
        """Open loop: open idle keep-alive connections before the common start, so the first sends find one.

        Bounded by the time left before the start; a connection that fails is left to the request (its record)."""
        budget = min(self.timeouts.connect_s, start_mono - time.perf_counter() - 0.005)
        if budget <= 0:
            return
        addr = _host_port(self.plan.url)
        if addr is None:
            return  # not a URL the lean client speaks: each request records why
        try:
            async with asyncio.timeout(budget):
                await http.warm(*addr, min(self.plan.slots or WARM_MAX, WARM_MAX), self.timeouts.connect_s)
        except TimeoutError:
            pass

    async def run(self, http: Http, start_mono: float) -> GeneratorReport:
        """Wait for the common start, drive the level, flush everything; returns the generator's summary."""
        monitor = LoopMonitor()
        flusher = asyncio.get_running_loop().create_task(self._flusher())
        status: GeneratorStatus = "complete"
        error: str | None = None
        try:
            if self.plan.arrivals is not None and isinstance(http, http1.Pool):
                await self._warm(http, start_mono)
            _freeze_heap(start_mono)
            # The open loop starts a little early: its sender builds the first requests and arms the timer for the
            # first due time (a sleep's wake-up can be a millisecond late; nothing is sent before it is due).
            early = OPEN_LOOP_EARLY_S if self.plan.arrivals is not None else 0.0
            delay = start_mono - early - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            monitor.start()
            self.started_mono = max(time.perf_counter(), start_mono)
            level = (
                self._closed_loop(http, start_mono) if self.plan.arrivals is None else self._open_loop(http, start_mono)
            )
            await self._bounded(level, start_mono)
            if self.unreachable:
                status = "partial"
                error = f"server unreachable: {UNREACHABLE_AFTER} connections refused in a row; stopped sending"
        except asyncio.CancelledError:
            status, error = "interrupted", "stopped before the level ended"
        except Exception as e:  # a bug in the level's own machinery: end the point, keep every record taken
            status, error = "failed", f"level stopped: {unexpected_error(e)}"
            _log.error(
                "point %s, generator %d: the level stopped on an unexpected exception",
                self.plan.point.point,
                self.plan.generator,
                exc_info=e,
            )
        finally:
            gc.unfreeze()
            self.ended_mono = time.perf_counter()
            flusher.cancel()
            health = await monitor.stop() if monitor._task else {}
            try:
                await asyncio.get_running_loop().run_in_executor(self._parts, self.writer.close)
            except Exception as e:  # reported with the records not saved, never a crash
                status = "failed"
                error = f"{self._write_failure(e, 'the last part file')}; {self.writer.pending} records not saved"
            self._parts.shutdown(wait=False)
        return self.summary(status, error, health)

    def _rate_ratio(self) -> float | None:
        """Open loop: achieved send rate over the schedule's own rate (1.0 = kept up; < 0.99 = fell behind)."""
        if self.plan.arrivals is None or len(self.first_sends) < 2:
            return None
        intended = [i for i, _ in self.first_sends]
        actual = [a for _, a in self.first_sends]
        # Achieved span from the schedule's own start: a late first send cannot make the rate look higher.
        planned, achieved = max(intended) - min(intended), max(actual) - min(intended)
        return planned / achieved if planned > 0 and achieved > 0 else None

    def summary(self, status: GeneratorStatus, error: str | None, health: dict[str, Any]) -> GeneratorReport:
        slips = np.asarray(self.slips) if self.slips else np.zeros(1)
        window = (self.ended_mono or 0) - (self.started_mono or 0)
        return GeneratorReport(
            generator=self.plan.generator,
            host=self.host,
            status=status,
            error=error,
            rows_written=self.writer.rows_written,
            rows_unwritten=self.writer.pending,
            rows_repaired=self.writer.rows_repaired,
            parts=list(self.writer.parts),
            scheduled=self.counts["scheduled"],
            records=RecordCounts(**{k: self.counts[k] for k in ("ok", "failed", "cancelled")}),
            tokens=self.counts["tokens"],
            ended_early=self.counts["ended_early"],
            tokens_estimated=self.counts["tokens_estimated"],
            slip_p50_s=float(np.percentile(slips, 50)),
            slip_p99_s=float(np.percentile(slips, 99)),
            achieved_rate=achieved_rate(len(self.slips), *self.send_span),
            rate_ratio=self._rate_ratio(),
            window_s=window,
            **health,
        )
