"""A load profile on one generator: which phase a time falls in, and the closed loop's cap per phase.

Lowering the concurrency never cancels: a slot at or above the new cap finishes the request it has in flight and
then sends nothing (no new session, no next turn) until a later phase gives it room again, or the level ends.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Sequence


class PhaseGate:
    """Phases starting at ``starts`` (seconds from ``origin``, a perf_counter time); ``caps``: this generator's
    closed-loop slots per phase (empty for the open loop, whose arrivals carry the profile)."""

    def __init__(self, starts: Sequence[float], caps: Sequence[int], origin: float) -> None:
        if caps and len(caps) != len(starts):
            raise ValueError(f"{len(caps)} caps for {len(starts)} phases")
        self.starts = list(starts)
        self.caps = list(caps)
        self.origin = origin

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

    async def admit(self, slot: int, deadline: float | None) -> bool:
        """Wait until slot ``slot`` may send; False if it may not again before ``deadline`` (or ever)."""
        while True:
            now = time.perf_counter()
            when = self.next_room(slot, now)
            if when is None or (deadline is not None and when >= deadline):
                return False
            if when <= now:
                return True
            await asyncio.sleep(when - now)
