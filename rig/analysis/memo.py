"""What a Run keeps of the results derived from its points' files (rig.analysis.runs.Run.memo), bounded by count and
bytes, made once when two threads ask for the same one."""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

MEMO_ENTRIES = 2  # derived per-point results a Run keeps at least (a 100 M-record run's point is ~160 MB of them)
# ... and more while they hold no more than this: a 10 M-record run's points are ~16 MB each, so the report's later
# sections (the best points' paired intervals and schedule) find the points they read again; a 100 M-record run
# keeps MEMO_ENTRIES, as before.
MEMO_BYTES = 256 * 2**20
T = TypeVar("T")


def nbytes(obj: Any) -> int:
    """The memory of what a Memo keeps: its numpy arrays and Arrow tables, in dataclasses, tuples and lists."""
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (pa.Table, pa.Array, pa.ChunkedArray, pa.RecordBatch)):
        return int(obj.nbytes)
    if isinstance(obj, (tuple, list)):
        return sum(nbytes(x) for x in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # its fields and what it cached (Requests.tpot)
        return sum(nbytes(v) for v in vars(obj).values())
    return 0


class Memo:
    """The last MEMO_ENTRIES results, and more while they hold no more than MEMO_BYTES; thread-safe."""

    def __init__(self) -> None:
        self.kept: OrderedDict[Hashable, Any] = OrderedDict()
        self.sizes: dict[Hashable, int] = {}
        self.making: dict[Hashable, Future] = {}
        self.lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        """The kept result of ``key``, else ``make()`` (kept); a thread asking while another makes it waits for that
        one (no second read); a failure is raised to both and not kept."""
        with self.lock:
            if key in self.kept:
                self.kept.move_to_end(key)
                return self.kept[key]
            making = self.making.get(key)
            mine = making is None
            if making is None:
                making = self.making[key] = Future()
        if not mine:
            return making.result()
        try:
            got = make()
        except BaseException as e:
            with self.lock:
                self.making.pop(key, None)
            making.set_exception(e)
            raise
        with self.lock:
            self.kept[key] = got
            self.sizes[key] = nbytes(got)
            while len(self.kept) > MEMO_ENTRIES and sum(self.sizes.values()) > MEMO_BYTES:
                self.sizes.pop(self.kept.popitem(last=False)[0], None)
            self.making.pop(key, None)
        making.set_result(got)
        return got

    def clear(self) -> None:
        with self.lock:
            self.kept.clear()
            self.sizes.clear()

    def kept_keys(self) -> list[Hashable]:
        with self.lock:
            return list(self.kept)
