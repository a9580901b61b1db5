"""Reads a report's points ahead of the one being summarised, on two threads, within a memory bound."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from rig.analysis import metrics as m
from rig.analysis.lossless import check_lossless
from rig.analysis.percentiles import read_itl
from rig.analysis.points import load_requests
from rig.analysis.runs import PointInfo, Run, point_files
from rig.analysis.server_series import Series, point_series
from rig.contracts import LosslessResult


def _hand_back_large_frees() -> None:
    """glibc keeps a freed block below its mmap threshold in the arena of the thread that freed it, and raises the
    threshold to the size of every large block freed (up to 32 MB): a large point's 16 MB arrays, made by two
    threads, would then hold two arenas' high-water marks. Fixing the threshold at 1 MiB maps every such array on
    its own and unmaps it when freed (glibc only; elsewhere nothing changes)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD (malloc.h)
    except (OSError, AttributeError):
        pass


class Reader:
    """Reads the report's points one or two ahead of the one being summarised, on two more threads (a point's metric
    columns and server series on one, its ITL lists on the other): Arrow's reads and numpy's array work release the
    GIL, so reading the next point overlaps with the percentiles of this one and both cores work (the report's
    arithmetic is unchanged: the same functions on the same arrays). Then the losslessness check, which needs no
    point's figures, runs beside the last points. Each task's warnings are added in the order a single pass would
    add them."""

    # Memory bounds: reading and deriving a point takes about 5x its part files' size on disk at its peak. Small
    # points are read two ahead and the losslessness check runs beside the last ones; large points (a 100 M-record
    # run's are 270 MB of files, 1.2 GB at the peak) are read one at a time, when asked for, and losslessness is
    # checked alone after them: the report's memory is that of its largest point, whatever the number of points.
    SMALL_POINT = 64 * 2**20  # bytes on disk
    SMALL_RUN = 2 * 2**30

    def __init__(self, run: Run) -> None:
        self.run = run
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="rig-report-reader")
        self.todo = list(run.points)
        self.ahead: deque[tuple[Future, Future]] = deque()
        self.check: Future | None = None
        sizes = [sum(os.path.getsize(f) for f in point_files(run.run_dir, p.point)) for p in run.points]
        self.depth = 2 if max(sizes, default=0) <= self.SMALL_POINT else 0
        if not self.depth:
            _hand_back_large_frees()
        self.overlap_check = sum(sizes) <= self.SMALL_RUN
        self._fill()

    def _deferred(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, list[str]]:
        with self.run.deferred_notes() as notes:
            return fn(*args), notes

    def _inputs(self, p: PointInfo) -> tuple[m.Requests, dict[str, Series]]:
        return load_requests(self.run, p), point_series(self.run, p.point)

    def _submit(self, p: PointInfo) -> tuple[Future, Future]:
        inputs = self.pool.submit(self._deferred, self._inputs, p)
        if not self.depth:  # a large point: its lists after its columns, on the same thread (the memory of one)
            return inputs, self.pool.submit(self._after, inputs, read_itl, self.run, p)
        return inputs, self.pool.submit(self._deferred, read_itl, self.run, p)

    def _after(self, first: Future, fn: Callable[..., Any], *args: Any) -> tuple[Any, list[str]]:
        first.exception()  # waits for it (its error, if any, is raised where it is taken)
        return self._deferred(fn, *args)

    def _fill(self) -> None:
        while self.todo and len(self.ahead) < self.depth:
            self.ahead.append(self._submit(self.todo.pop(0)))
        if not self.todo and self.check is None and self.overlap_check:
            self.check = self.pool.submit(self._deferred, check_lossless, self.run)

    def _take(self, future: Future) -> Any:
        try:
            got, notes = future.result()
        except BaseException:
            self.pool.shutdown(wait=True, cancel_futures=True)
            raise
        for n in notes:
            self.run.note(n)
        return got

    def next(self, p: PointInfo) -> tuple[m.Requests, dict[str, Series], tuple[np.ndarray, np.ndarray]]:
        """The requests, server series and ITL of ``p`` (the next point of run.points)."""
        if not self.ahead:  # large points: this one, now
            self.ahead.append(self._submit(self.todo.pop(0)))
        inputs, itl = self.ahead.popleft()
        (r, series), lists = self._take(inputs), self._take(itl)
        if not self.depth:  # large points: hand the last one's Arrow buffers back to the system (4 ms a call)
            pa.default_memory_pool().release_unused()
        self._fill()
        return r, series, lists

    def beside(self, fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
        """``fn(*args)`` on a reader thread, now, in a small run of small points (its warnings deferred), else when
        the returned callable is called (large points' sections one at a time: the memory of one); call it for the
        result."""
        if not (self.depth and self.overlap_check):
            return lambda: fn(*args)
        future = self.pool.submit(self._deferred, fn, *args)
        return lambda: self._take(future)

    def lossless(self) -> LosslessResult:
        """check_lossless(run), once every point was taken."""
        self.run.forget()  # the points' kept arrays: what follows reads again the few points it needs
        pa.default_memory_pool().release_unused()
        if self.check is None:  # a large run: now, with no point's arrays held
            self.check = self.pool.submit(self._deferred, check_lossless, self.run)
        got: LosslessResult = self._take(self.check)
        self.pool.shutdown(wait=True)
        return got
