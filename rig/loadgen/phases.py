"""A load profile on one generator: which phase a time falls in, and the closed loop's cap per phase.

Lowering the concurrency never cancels: requests in flight finish, and nothing more is sent (no new session, no
next turn) until the generator's requests in flight are below the new cap; a slot at or above the cap waits for a
later phase that gives it room again, or for the level's end.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections.abc import Callable, Sequence


class PhaseGate:
    """Phases starting at ``starts`` (seconds from ``origin``, a perf_counter time); ``caps``: this generator's
    closed-loop slots per phase (empty for the open loop, whose arrivals carry the profile); ``in_flight``: the
    generator's requests in flight now."""

    def __init__(
        self, starts: Sequence[float], caps: Sequence[int], origin: float, in_flight: Callable[[], int] = lambda: 0
    ) -> None:
        if caps and len(caps) != len(starts):
            raise ValueError(f"{len(caps)} caps for {len(starts)} phases")
        self.starts = list(starts)
        self.caps = list(caps)
        self.origin = origin
        self.in_flight = in_flight
        self._freed: asyncio.Event | None = None  # made on first wait (inside the level's event loop)

    def phase_at(self, mono: float) -> int:
        """The index of the phase running at ``mono`` (before the first: 0; after the last: the last)."""
        return max(0, bisect.bisect_right(self.starts, mono - self.origin) - 1)

    def cap_at(self, mono: float) -> int | None:
        """This generator's concurrency at ``mono`` (None: no cap from the profile)."""
        return self.caps[self.phase_at(mono)] if self.caps else None

    def next_room(self, slot: int, mono: float) -> float | None:
        """When slot ``slot`` may next send: ``mono`` if its phase has room, the start of the next phase that does,
        or None if none does."""
        if not self.caps:
            return mono
        i = self.phase_at(mono)
        for j in range(i, len(self.caps)):
            if self.caps[j] > slot:
                return mono if j == i else self.origin + self.starts[j]
        return None

    def ever(self, slot: int) -> bool:
        """Does any phase give slot ``slot`` room?"""
        return not self.caps or max(self.caps) > slot

    def freed(self) -> None:
        """A request of this generator ended: a slot waiting for the in-flight count to fall may go."""
        if self._freed is not None:
            self._freed.set()

    async def admit(self, slot: int, deadline: float | None) -> bool:
        """Wait until slot ``slot`` may send (its phase has room for it and fewer requests than the cap are in
        flight); False if it may not again before ``deadline`` (or ever)."""
        while True:
            now = time.perf_counter()
            when = self.next_room(slot, now)
            if when is None or (deadline is not None and when >= deadline):
                return False
            if when > now:
                await asyncio.sleep(when - now)
                continue
            cap = self.cap_at(now)
            if cap is None or self.in_flight() < cap:
                return True
            # Above a lowered cap: wait for a request to end (or the next phase, or the deadline), then look again.
            if self._freed is None:
                self._freed = asyncio.Event()
            self._freed.clear()
            wake = [t for t in (deadline, self._next_start(now)) if t is not None]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._freed.wait(), timeout=(min(wake) - now) if wake else None)

    def _next_start(self, mono: float) -> float | None:
        i = self.phase_at(mono) + 1
        return self.origin + self.starts[i] if i < len(self.starts) else None
