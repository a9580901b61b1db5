"""Stopping a run: the stop request every wait loop reads, and the SIGINT/SIGTERM handlers that set it."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any


class StopControl:
    """A run's stop request: set once (by a signal, Ctrl-C or a caller) and read by every wait loop."""

    def __init__(self, announce: Callable[[str], None]):
        self.announce = announce
        self.requested = threading.Event()
        self.reason = ""
        self.at: float | None = None  # monotonic time of the first request
        self.finalizing = False  # set once the run's final bookkeeping starts (a second signal must not cut it)

    def is_set(self) -> bool:
        return self.requested.is_set()

    def request(self, reason: str) -> None:
        if not self.requested.is_set():
            self.at = time.monotonic()
            self.announce(f"stopping ({reason}): in-flight requests are recorded as cancelled")
        self.reason = reason
        self.requested.set()


def install_signal_handlers(stop: StopControl) -> None:
    """SIGINT/SIGTERM stop the run cleanly: generators record in-flight requests as cancelled, then teardown."""

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            if stop.finalizing:
                return  # the run is writing its final manifest: let it finish
            raise KeyboardInterrupt  # second signal: stop waiting
        stop.request(f"stopped by {signal.Signals(signum).name}")

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
