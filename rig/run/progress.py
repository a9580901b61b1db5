"""The callbacks a run reports through (the CLI's progress bar and live view); no-ops by default."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rig.contracts import PointEntry
from rig.run.live import LiveSnapshot


@dataclass
class Progress:
    """Callbacks the CLI provides to show what is going on (no-ops by default). ``live``: the CLI shows the live
    view, so each progress beat also asks the server for its gauges and calls ``point_live``."""

    status: Callable[[str], None] = lambda msg: None
    point_start: Callable[[str, int | None], None] = lambda point, total: None
    point_update: Callable[[int, dict[str, int]], None] = lambda done, counts: None
    point_end: Callable[[str, PointEntry], None] = lambda point, entry: None
    live: bool = False
    point_live: Callable[[LiveSnapshot], None] = lambda snapshot: None
