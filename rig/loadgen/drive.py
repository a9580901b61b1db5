"""Drive one point on one generator: closed loop by slots or open loop by arrival times; every request a record.

Pure asyncio, no Ray: the Ray actor (actor.py) wraps it, tests drive it directly. The open loop's sender is
rig.loadgen.open_loop, part files are written as the level runs by rig.loadgen.flush, one request is sent by
rig.loadgen.client (the lean HTTP/1.1 client, rig.loadgen.http1) or rig.loadgen.aio_client (aiohttp), and what it
came to becomes the record's request fields in rig.loadgen.outcome.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from rig.contracts import (
    GeneratorProgress,
    GeneratorReport,
    GeneratorStatus,
    RecordCounts,
    achieved_rate,
    check_record,
    repair_record,
)
from rig.contracts.live import RequestLatencies
from rig.loadgen import http1
from rig.loadgen.apis import api_for
from rig.loadgen.client import LeanRequest, Outcome, request_fields, reuse_trace, stream_request, unexpected_error
from rig.loadgen.closed_loop import closed_loop, primed_sessions
from rig.loadgen.flush import Flusher
from rig.loadgen.gc_gaps import freeze_heap
from rig.loadgen.health import LoopMonitor
from rig.loadgen.open_loop import LEVEL_FAILED, Due, Http, OpenLoop, host_port
from rig.loadgen.outcome import OK_COUNTS, count_ok
from rig.loadgen.pacer import Pacer
from rig.loadgen.phases import PhaseGate
from rig.loadgen.plan import GeneratorPlan
from rig.loadgen.wire_ids import new_rid_tag
from rig.results import REQUEST_SCHEMA, PartWriter, empty_record, requests_dir
from rig.workloads.base import Session, Turn

_log = logging.getLogger(__name__)
__all__ = ["LEVEL_FAILED", "PointRun", "make_session"]
_Due = Due  # the name tests and older callers use
UNREACHABLE_AFTER = 3  # consecutive refused connections after which a generator stops starting sessions
OPEN_LOOP_EARLY_S = 0.010  # the open loop's sender starts this long before the level (nothing is sent early)
WARM_MAX = 32  # open loop, lean client: idle connections opened before the level starts (open_loop: WARM_LOW)


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


class PointRun:
    """State of one generator's share of one point."""

    def __init__(self, plan: GeneratorPlan, out_root: Path | str, host: str, clock_offset_s: float) -> None:
        self.plan = plan
        self.api = api_for(plan.point.api, plan.dialect, rid_tag=new_rid_tag())  # ids unique per attempt
        self.host = host
        self.clock_offset_s = clock_offset_s
        self.writer = PartWriter(
            requests_dir(Path(out_root), plan.point.point, plan.generator), REQUEST_SCHEMA, repair=self._repaired
        )
        self.timeouts = plan.timeouts
        self.headers = dict(plan.extra_headers)
        self.counts: dict[str, int] = {
            "scheduled": 0,
            "ok": 0,
            "failed": 0,
            "cancelled": 0,
            "in_flight": 0,
            "tokens": 0,
            **dict.fromkeys(OK_COUNTS, 0),
        }
        self.latencies = RequestLatencies()  # the live view's sketches of successful requests' TTFT and TPOT
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
        self.ran_out_s = plan.supply_ends_s  # closed loop: set when its sessions run out before the duration ends
        self.cancel_reason = "cancelled: the run was stopped"  # what a cancelled in-flight request records
        self.warm_ok = 0  # warm-up requests that succeeded so far
        self.flusher = Flusher(self.writer)  # part files written while the level runs
        self._pacer: Pacer | None = None  # the open loop's sender while it runs: other work lets due sends go first
        self.gate: PhaseGate | None = None  # a load profile's phases, from the level's start (run)

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
        rec["wire_request_id"] = self.api.wire_id(turn)
        rec["session_id"] = session.session_id
        rec["turn"] = j
        if self.gate is not None:
            rec["phase"] = self.gate.phase_at(intended)  # the phase it was due in (sent then, or skipped then)
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
            count_ok(self.counts, out, turn, tokens)
            self.latencies.add(rec["ttft_s"], rec["e2e_s"], tokens)
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

    def progress(self) -> GeneratorProgress:
        """The live view's snapshot: the counters and a copy of the latency sketches."""
        return self.latencies.snapshot(self.counts)

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
        self,
        http: Http,
        session: Session,
        intended: float,
        deadline: float | None,
        first: LeanRequest | None = None,
        *,
        slot: int | None = None,
    ) -> None:
        """Every turn of one session, each a record; ``first``: the first turn, built ahead (and maybe sent);
        ``slot``: the closed loop's slot, whose later turns wait while a load profile's phase has no room for it."""
        history: list[dict[str, str]] = []
        self.counts["scheduled"] += session.n_requests
        for j, turn in enumerate(session.turns):
            if j > 0:
                if not await self._next_turn(session, j, deadline, slot):
                    return
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
                if self.gate is not None:
                    self.gate.freed()  # a slot waiting for in-flight requests to fall below a lowered cap may go
            out = self._record_or_fail(session, j, turn, intended, out)
            if out.status != "ok":
                for k in range(j + 1, session.n_requests):
                    self._skip(session, k, session.turns[k], f"not sent: turn {j} failed")
                return
            history = [*history, *turn.messages, {"role": "assistant", "content": out.state.reply}]

    async def _next_turn(self, session: Session, j: int, deadline: float | None, slot: int | None) -> bool:
        """Think time before turn ``j`` (and, under a load profile, room for the slot); False: turns from ``j`` on
        are recorded as not sent."""
        turn = session.turns[j]
        why = None
        if deadline is not None and time.perf_counter() + turn.think_time_s >= deadline:
            why = "not sent: the level's duration ended"
        else:
            try:
                if turn.think_time_s > 0:
                    await asyncio.sleep(turn.think_time_s)
                if slot is not None and self.gate is not None and not await self.gate.admit(slot, deadline):
                    why = "not sent: the load profile left its slot no room before the level ended"
            except asyncio.CancelledError:  # its remaining turns were scheduled: record them
                for k in range(j, session.n_requests):
                    self._skip(session, k, session.turns[k], f"not sent: {self.cancel_reason}")
                raise
        if why is not None:
            for k in range(j, session.n_requests):
                self._skip(session, k, session.turns[k], why)
        return why is None

    async def _closed_loop(self, http: Http, start: float, todo: Iterator[Session] | None = None) -> None:
        """Slots that each send the next session when their last one ended (rig.loadgen.closed_loop)."""
        await closed_loop(self, http, start, todo)

    async def _open_loop(self, http: Http, start: float) -> None:
        """Each session's first turn sent at its arrival time (rig.loadgen.open_loop)."""
        await OpenLoop(self, http, start).drive()

    def set_pacer(self, pacer: Pacer | None) -> None:
        """The open loop's sender while it runs (None after): records and flush steps let due sends go first."""
        self._pacer = pacer
        self.flusher.pacer = pacer

    def _cancelled_before_start(self, item: Due) -> None:
        session, now = item.session, time.perf_counter()
        self.counts["scheduled"] += session.n_requests
        out = item.request.out if item.request is not None else None  # written by the timer's callback
        sent = out is not None
        send = out.send_mono if out is not None else now
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

    async def _bounded(self, level: Awaitable[None], start: float) -> None:
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
        """Write a part if one is due (``Flusher.flush_due``)."""
        await self.flusher.flush_due()

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
        addr = host_port(self.plan.url)
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
            todo = primed_sessions(self) if self.plan.arrivals is None else None
            freeze_heap(start_mono)
            # The open loop starts a little early: its sender builds the first requests and arms the timer for the
            # first due time (a sleep's wake-up can be a millisecond late; nothing is sent before it is due).
            early = OPEN_LOOP_EARLY_S if self.plan.arrivals is not None else 0.0
            delay = start_mono - early - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            monitor.start()
            self.started_mono = max(time.perf_counter(), start_mono)
            if self.plan.phase_starts:
                self.gate = PhaseGate(
                    self.plan.phase_starts, self.plan.phase_slots, start_mono, lambda: self.counts["in_flight"]
                )
            level = (
                self._closed_loop(http, start_mono, todo)
                if self.plan.arrivals is None
                else self._open_loop(http, start_mono)
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
                await self.flusher.close()
            except Exception as e:  # reported with the records not saved, never a crash
                status = "failed"
                error = f"{self._write_failure(e, 'the last part file')}; {self.writer.pending} records not saved"
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

    def summary(self, status: GeneratorStatus, error: str | None, health: dict[str, float | None]) -> GeneratorReport:
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
            **{k: self.counts[k] for k in OK_COUNTS},
            ran_out_s=self.ran_out_s,
            slip_p50_s=float(np.percentile(slips, 50)),
            slip_p99_s=float(np.percentile(slips, 99)),
            achieved_rate=achieved_rate(len(self.slips), *self.send_span),
            rate_ratio=self._rate_ratio(),
            window_s=window,
            **health,
        )
