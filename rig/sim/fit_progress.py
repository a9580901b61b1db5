"""``rig sim fit``'s progress: evaluations done of the most it may take, the objective, the time so far.

On a terminal a status line updates in place; elsewhere (a pipe, a CI log) a line is printed every ``every_s``
seconds, so a fit of several minutes never sits silent. The first evaluation is shown at once (it starts the
worker processes, the slowest one).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class FitProgress:
    """A fit's progress callback (``progress(n_evals, objective)``) for a rich Console and its status."""

    def __init__(
        self,
        console: Any,
        max_evals: int,
        status: Any = None,
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console, self.max_evals, self.status, self.every_s, self.clock = console, max_evals, status, every_s, clock
        self.t0 = clock()
        self.last: float | None = None

    def text(self, n: int, value: float) -> str:
        return (
            f"fitting: {n:,} of at most {self.max_evals:,} evaluations, objective {value:.5f}, "
            f"{self.clock() - self.t0:.0f} s"
        )

    def __call__(self, n: int, value: float) -> None:
        if self.status is not None and self.console.is_terminal:
            self.status.update(self.text(n, value))
            return
        now = self.clock()
        if self.last is None or now - self.last >= self.every_s:
            self.last = now
            self.console.print(self.text(n, value), highlight=False)

    def step(self, line: str) -> None:
        """A step of its own (a held-out fit begins): shown on a terminal's status, printed elsewhere."""
        if self.status is not None and self.console.is_terminal:
            self.status.update(line)
        else:
            self.console.print(line, highlight=False)
