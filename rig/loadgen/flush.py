"""Writing a point's records to part files while it runs, without stalling the open loop's sender."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from rig.loadgen.pacer import Pacer
from rig.results import PartWriter

FREE_SLICE = 128  # written rows released per step of the loop (~0.2 ms)
FLUSH_GAP_S = 0.0005  # open loop: a flush step starts only when no send is due within this ...
GAP_WAIT_MAX_S = 0.005  # ... or once it has waited this long for such a gap (a dense schedule still gets written)
WRITER_NICE = 19  # the part writer's thread: the lowest CPU priority, so the sender never waits behind it


def _lower_priority() -> None:
    """The part writer's thread at the lowest priority: on a shared core the event loop always goes first.

    Encoding a part took 120 ms of wall time at 2,000 req/s; at equal priority the scheduler shared the core with
    it and sends due meanwhile slipped by milliseconds. Linux takes a thread id here (elsewhere: left as it is).
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)


class Flusher:
    """Turns the writer's buffered rows into part files a bounded step at a time on the loop, the encoding and
    writing in a low-priority thread; in the open loop each step waits for a gap in the send schedule."""

    def __init__(self, writer: PartWriter) -> None:
        self.writer = writer
        self.parts = ThreadPoolExecutor(1, thread_name_prefix="rig-parts", initializer=_lower_priority)
        self.pacer: Pacer | None = None  # the open loop's sender while it runs: flush steps let due sends go first
        self._gap_waiters: list[asyncio.Future[None]] = []  # flush steps waiting for a gap in the schedule

    async def flush_due(self) -> None:
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
                await self.gap(FLUSH_GAP_S)
                builder.step()
            table = builder.table()
        except BaseException:  # the level ended mid-flush (or a bug): the rows go back for the next or final write
            self.writer.untake(rows)
            raise
        del builder
        # Cancelled from here on, the thread still writes these rows, and the final write waits for it. Shielded:
        # cancelling an executor future that has not started yet (the nice-19 thread not scheduled, on a busy host)
        # drops the work item, and these rows were taken: 8 records of 60 were lost so beside a CPU-heavy job.
        await asyncio.shield(asyncio.wrap_future(self.parts.submit(self.writer.write, rows, table)))
        del table
        for end in range(len(rows), 0, -FREE_SLICE):  # releasing 5,000 records at once held the loop ~8 ms
            await self.gap(FLUSH_GAP_S)
            del rows[max(0, end - FREE_SLICE) : end]

    async def close(self) -> None:
        """The last part, written in the thread (it waits for a write in progress); then the thread ends."""
        try:  # shielded as the parts are: a cancelled close still writes the last rows
            await asyncio.shield(asyncio.wrap_future(self.parts.submit(self.writer.close)))
        finally:
            self.parts.shutdown(wait=False)

    async def gap(self, need_s: float) -> None:
        """Yield to the loop; then, in the open loop, wait until no send is due within ``need_s`` (at most
        ``GAP_WAIT_MAX_S``)."""
        await asyncio.sleep(0)  # the reads and the sends due get a turn between steps
        need = int(need_s * 1e9)
        give_up = time.perf_counter_ns() + int(GAP_WAIT_MAX_S * 1e9)
        while (pacer := self.pacer) is not None:
            now = time.perf_counter_ns()
            if pacer.due_ns - now >= need or now >= give_up:
                return
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._gap_waiters.append(waiter)
            await waiter  # the sender's next turn ends: look again

    def sent(self) -> None:
        """The sender's turn ended (or the level did): flush steps waiting for a gap look again."""
        waiters, self._gap_waiters = self._gap_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)
