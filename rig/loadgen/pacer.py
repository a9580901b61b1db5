"""Waking the sender at a send's due time: a Linux timerfd on the event loop, else a short spin.

asyncio's timers have millisecond granularity (uvloop's can fire a millisecond early, asyncio's own ~0.6 ms late),
so the fallback sleeps to 1.5 ms before the due time and then yields until it comes -- which keeps the process
busy, and on a shared host a busy process waits longer for its turn on a core. A timerfd set to the absolute
due time (CLOCK_MONOTONIC, the clock of ``time.perf_counter`` on Linux) never fires early and wakes the loop
within tens of microseconds, with the process asleep until then.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import sys
import time
from typing import Callable

SPIN_S = 0.0015  # fallback: sleep until this close, then yield until due
_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc():
    if not sys.platform.startswith("linux") or time.get_clock_info("perf_counter").implementation != \
            "clock_gettime(CLOCK_MONOTONIC)":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.timerfd_create.restype = ctypes.c_int
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
        return libc
    except (OSError, AttributeError):
        return None


class Pacer:
    """``await pacer.sleep_until(due)`` returns at or just after ``time.perf_counter() >= due``;
    ``await pacer.call_at(due, fn)`` runs ``fn`` on the timer's callback first. One waiter."""

    def __init__(self) -> None:
        self._libc = _libc()
        self.fd = -1
        if self._libc is not None:
            fd = self._libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            self.fd = fd if fd >= 0 else -1
        self._spec = _Itimerspec()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future | None = None
        self._fn: Callable[[], None] | None = None

    @property
    def precise(self) -> bool:
        return self.fd >= 0

    async def sleep_until(self, due: float) -> None:
        await self.call_at(due, _nothing)
        while time.perf_counter() < due:  # never expected; a guard against a clock mismatch
            await asyncio.sleep(0)

    async def call_at(self, due: float, fn: Callable[[], None]) -> bool:
        """Run ``fn()`` on the timer's own callback at ``due`` (at once if it is past, returning False), then return.

        The callback runs in the event loop turn that the timerfd wakes, before any task resumes: the open loop
        sends from it. ``fn`` must not block; it is called once, and should itself check that its time has come
        (a guard against a clock mismatch, never expected).
        """
        if due <= time.perf_counter():
            fn()
            return False
        if self.fd < 0:
            await spin_until(due)
            fn()
            return True
        sec = int(due)
        self._spec.it_value.tv_sec, self._spec.it_value.tv_nsec = sec, int((due - sec) * 1e9)
        if self._libc.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            await spin_until(due)
            fn()
            return True
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # one registration for the pacer's life: no epoll change per send
            if self._loop is not None:
                self._loop.remove_reader(self.fd)
            loop.add_reader(self.fd, self._fired)
            self._loop = loop
        fut = self._waiter = loop.create_future()
        self._fn = fn
        try:
            await fut
        finally:
            self._waiter = self._fn = None
        return True

    def _fired(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            return  # a spurious wake-up: keep waiting
        fut, fn = self._waiter, self._fn
        if fut is None or fut.done() or fn is None:
            return  # nobody waits (cancelled meanwhile)
        self._fn = None
        try:
            fn()
        except BaseException as e:  # handed to the waiter, never lost in the loop's exception handler
            fut.set_exception(e)
        else:
            fut.set_result(None)

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.fd)
        self._loop = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _nothing() -> None:
    pass


async def spin_until(due: float) -> None:
    """Wait until perf_counter() >= due with sub-millisecond precision, still yielding to other tasks."""
    delay = due - time.perf_counter() - SPIN_S
    if delay > 0:
        await asyncio.sleep(delay)
    while time.perf_counter() < due:
        await asyncio.sleep(0)
