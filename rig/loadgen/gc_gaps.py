"""Young garbage collections in the open loop's gaps, instead of wherever an allocation trips the threshold.

CPython collects generation 0 every ~700 net allocations of container objects and generation 1 every 10th time:
at 2,000 requests/s that is ~90 stops of the event loop per second (0.2-0.5 ms each, 1-1.5 ms for generation 1),
in whatever callback allocated last -- often just before a send was due. While a ``GapCollector`` is started the
automatic collector only runs as a backstop (``BACKSTOP`` allocations), and the sender, right after a send, runs
the collection that was due when the next send is far enough away. Generation 2 is left as it was: the heap
frozen at the level's start holds nearly everything older, and after the level the automatic collector resumes.
"""

from __future__ import annotations

import gc
import time

GEN0_GAP_S = 0.001  # a generation-0 collection starts only when no send is due within this
GEN1_GAP_S = 0.002  # ... a generation-1 collection within this
GAP_MARGIN = 2.0  # ... or within this many times the last collection of that generation, if that is longer
GEN1_FORCE = 4  # generation 1 this many times over its threshold: it runs in a generation-0 gap
GC_BEFORE_START_S = 0.5  # a full collection before the level if at least this long remains before its start
BACKSTOP = 50_000  # the automatic collector's generation-0 threshold while started: a dense schedule still collects


class GapCollector:
    """Defers young collections to gaps in the schedule while started (a no-op when the collector is disabled)."""

    def __init__(self) -> None:
        self._saved: tuple[int, int, int] | None = None
        self.need_s = [GEN0_GAP_S, GEN1_GAP_S]  # the gap each young generation's collection needs
        self.collections = [0, 0]

    def start(self) -> None:
        if self._saved is not None or not gc.isenabled():
            return
        t0, t1, t2 = gc.get_threshold()
        if t0 <= 0 or t0 >= BACKSTOP:
            return  # collection off, or already rarer than the backstop: leave it
        self._saved = (t0, t1, t2)
        gc.set_threshold(BACKSTOP, t1, t2)

    def stop(self) -> None:
        if self._saved is not None:
            gc.set_threshold(*self._saved)
            self._saved = None

    @property
    def active(self) -> bool:
        return self._saved is not None

    def collect(self, gap_s: float) -> int | None:
        """Run the young collection that is due if it fits in ``gap_s`` (the time to the next send); which one ran."""
        if self._saved is None:
            return None
        t0, t1, _ = self._saved
        c0, c1, _ = gc.get_count()
        need = self.need_s
        if c0 < t0 or gap_s < need[0]:
            return None
        gen = 1 if c1 >= t1 and (gap_s >= need[1] or c1 >= GEN1_FORCE * t1) else 0
        began = time.perf_counter()
        gc.collect(gen)
        took = time.perf_counter() - began
        need[gen] = max(GEN0_GAP_S if gen == 0 else GEN1_GAP_S, GAP_MARGIN * took)
        self.collections[gen] += 1
        return gen


def freeze_heap(start_mono: float) -> None:
    """Move every object alive before the level out of the GC's reach until it ends (``gc.unfreeze``).

    A full collection walks every tracked object: with the imports and the point's sessions that took 50-80 ms
    (650 ms in a backlog), a stall of the loop that every send due meanwhile shows as slip. Frozen, a collection
    during the level walks only what the level made. Garbage is collected first if there is time before the start.
    """
    if start_mono - time.perf_counter() > GC_BEFORE_START_S:
        gc.collect()
    gc.freeze()
