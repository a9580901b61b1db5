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
    """``await pacer.sleep_until(due)`` returns at or just after ``time.perf_counter() >= due``. One waiter."""

    def __init__(self) -> None:
        self._libc = _libc()
        self.fd = -1
        if self._libc is not None:
            fd = self._libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            self.fd = fd if fd >= 0 else -1
        self._spec = _Itimerspec()

    @property
    def precise(self) -> bool:
        return self.fd >= 0

    async def sleep_until(self, due: float) -> None:
        if self.fd < 0:
            await spin_until(due)
            return
        if due <= time.perf_counter():
            return
        sec = int(due)
        self._spec.it_value.tv_sec, self._spec.it_value.tv_nsec = sec, int((due - sec) * 1e9)
        if self._libc.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            await spin_until(due)
            return
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        loop.add_reader(self.fd, self._fired, fut)
        try:
            await fut
        finally:
            loop.remove_reader(self.fd)
        while time.perf_counter() < due:  # never expected; a guard against a clock mismatch
            await asyncio.sleep(0)

    def _fired(self, fut: asyncio.Future) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            return  # a spurious wake-up: keep waiting
        if not fut.done():
            fut.set_result(None)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


async def spin_until(due: float) -> None:
    """Wait until perf_counter() >= due with sub-millisecond precision, still yielding to other tasks."""
    delay = due - time.perf_counter() - SPIN_S
    if delay > 0:
        await asyncio.sleep(delay)
    while time.perf_counter() < due:
        await asyncio.sleep(0)
