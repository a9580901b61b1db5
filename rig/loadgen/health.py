"""Self-checks of a load generator: event-loop lag and CPU use while it drives load."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

import numpy as np
import psutil

RESERVOIR = 100_000  # lag samples kept (about 17 minutes at one per 10 ms, then sampled uniformly)


class LoopMonitor:
    """Samples how late a periodic 10 ms sleep wakes up: the event loop's scheduling lag."""

    def __init__(self, period_s: float = 0.010):
        self.period_s = period_s
        self.lags: list[float] = []
        self.max_lag = 0.0
        self._task: asyncio.Task | None = None
        self._proc = psutil.Process()
        self._cpu_start = 0.0
        self._wall_start = 0.0

    def start(self) -> None:
        self._cpu_start = sum(self._proc.cpu_times()[:2])
        self._wall_start = time.perf_counter()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        rng = random.Random(0)
        n = 0
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.period_s)
            lag = max(0.0, time.perf_counter() - t - self.period_s)
            self.max_lag = max(self.max_lag, lag)
            n += 1
            # A uniform reservoir: bounded memory over a night-long point, unbiased percentiles.
            if len(self.lags) < RESERVOIR:
                self.lags.append(lag)
            elif (j := rng.randrange(n)) < RESERVOIR:
                self.lags[j] = lag

    async def stop(self) -> dict[str, float | None]:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        wall = time.perf_counter() - self._wall_start
        cpu = sum(self._proc.cpu_times()[:2]) - self._cpu_start
        lags = np.asarray(self.lags) if self.lags else np.zeros(1)
        return {
            "loop_lag_p50_ms": float(np.percentile(lags, 50) * 1e3),
            "loop_lag_p99_ms": float(np.percentile(lags, 99) * 1e3),
            "loop_lag_max_ms": float(self.max_lag * 1e3),
            "cpu_pct": float(100.0 * cpu / wall) if wall > 0 else None,
        }
