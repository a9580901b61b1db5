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
import functools
import math
import os
import sys
import time
from collections.abc import Callable

SPIN_S = 0.0015  # fallback: sleep until this close, then yield until due
_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """libc with timerfd, or None; loaded once: find_library runs ldconfig, milliseconds a level's first send
    should not wait for."""
    if (
        not sys.platform.startswith("linux")
        or time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)"
    ):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.timerfd_create.restype = ctypes.c_int
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
        return libc
    except (OSError, AttributeError):
        return None


NEVER_NS = 1 << 62  # ``Pacer.due_ns`` while nothing is armed


class Pacer:
    """A one-shot timer for the open loop's sender: ``arm(due, fn)`` runs ``fn()`` on the timer's own callback at
    ``due`` (or earlier from ``run_due``, by a callback that finds it due first). One pending call at a time.

    ``due_ns`` is the pending call's due time in ``perf_counter_ns`` units (``NEVER_NS`` when none), so that other
    callbacks can ask cheaply whether a send is due (or soon due) and let it go first.
    """

    def __init__(self) -> None:
        self._libc = _libc()
        self.fd = -1
        if self._libc is not None:
            fd = self._libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            self.fd = fd if fd >= 0 else -1
        self._spec = _Itimerspec()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fn: Callable[[], None] | None = None
        self._handle: asyncio.Handle | None = None  # the fallback's timer (no timerfd)
        self.due_ns = NEVER_NS

    @property
    def precise(self) -> bool:
        return self.fd >= 0

    def arm(self, due: float, fn: Callable[[], None]) -> None:
        """Run ``fn()`` once, at or after ``due`` (``perf_counter`` seconds), from the event loop; replaces a pending
        call. A due time already past runs at the loop's next poll, never here: the caller finishes first. ``fn``
        must not block or raise (it runs inside whichever callback finds it due)."""
        self.disarm()
        self._fn = fn
        self.due_ns = math.ceil(due * 1e9)
        loop = asyncio.get_running_loop()
        if self.fd >= 0 and self._libc is not None:
            sec = int(due)
            nsec = min(999_999_999, max(1, int((due - sec) * 1e9)))  # 0 would disarm the timerfd
            self._spec.it_value.tv_sec, self._spec.it_value.tv_nsec = sec, nsec
            if self._libc.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) == 0:
                if self._loop is not loop:  # one registration for the pacer's life: no epoll change per send
                    if self._loop is not None:
                        self._loop.remove_reader(self.fd)
                    loop.add_reader(self.fd, self._fired)
                    self._loop = loop
                return
        # No timerfd: sleep to SPIN_S before the due time, then yield until it comes.
        self._handle = loop.call_later(max(0.0, due - time.perf_counter() - SPIN_S), self._spin)

    def disarm(self) -> None:
        """Forget the pending call (a timerfd that already fired is drained by ``_fired`` and ignored)."""
        self._fn = None
        self.due_ns = NEVER_NS
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def run_due(self) -> None:
        """Run the pending call now if its time has come: a callback that would otherwise hold the send up (a read,
        a record) calls this first. A no-op before the due time."""
        if self._fn is not None and time.perf_counter_ns() >= self.due_ns:
            self._run()

    def _run(self) -> None:
        fn = self._fn
        self.disarm()
        if fn is not None:
            fn()

    def _fired(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            return  # a spurious wake-up, or the call already ran from run_due
        if self._fn is None:
            return  # nothing pending (disarmed meanwhile)
        if time.perf_counter_ns() < self.due_ns:  # never expected: a guard against a clock mismatch
            self._handle = asyncio.get_running_loop().call_soon(self._spin)
            return
        self._run()

    def _spin(self) -> None:
        self._handle = None
        if self._fn is None:
            return
        if time.perf_counter_ns() >= self.due_ns:
            self._run()
        else:
            self._handle = asyncio.get_running_loop().call_soon(self._spin)

    def close(self) -> None:
        self.disarm()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.fd)
        self._loop = None
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
