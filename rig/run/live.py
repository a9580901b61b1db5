"""The live view's figures, computed on the driver from what it polls while a level runs: the generators' merged
progress (counters and latency sketches) and the server's last gauges. Nothing is added to the request path."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from rig.contracts import GeneratorProgress, ServerGauges

TOK_S_WINDOW_S = 5.0  # tok/s is over the completed requests of the last this many seconds


@dataclass
class LiveSnapshot:
    """One beat of the live view."""

    elapsed_s: float
    scheduled: int
    ok: int
    failed: int
    cancelled: int
    in_flight: int
    tok_s: float | None  # output tokens of the requests completed in the last TOK_S_WINDOW_S, per second
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    server: ServerGauges | None

    @property
    def done(self) -> int:
        return self.ok + self.failed + self.cancelled


class LiveTracker:
    """Turns successive polls of one level into snapshots (keeps the last few seconds of token counts)."""

    def __init__(self, started: float, window_s: float = TOK_S_WINDOW_S) -> None:
        self.started = started
        self.window_s = window_s
        self.tokens: deque[tuple[float, int]] = deque()  # (driver monotonic time, completed tokens so far)

    def _tok_s(self, now: float, tokens: int) -> float | None:
        self.tokens.append((now, tokens))
        # keep one sample at or beyond the window's start, so the rate spans a whole window once there is one
        while len(self.tokens) > 2 and now - self.tokens[1][0] >= self.window_s:
            self.tokens.popleft()
        t0, k0 = self.tokens[0]
        span = now - t0
        return (tokens - k0) / span if span >= 1.0 else None

    def update(self, now: float, progress: GeneratorProgress, server: ServerGauges | None) -> LiveSnapshot:
        c = progress.counts
        return LiveSnapshot(
            elapsed_s=now - self.started,
            scheduled=c.get("scheduled", 0),
            ok=c.get("ok", 0),
            failed=c.get("failed", 0),
            cancelled=c.get("cancelled", 0),
            in_flight=c.get("in_flight", 0),
            tok_s=self._tok_s(now, c.get("tokens", 0)),
            ttft_p50_s=progress.ttft.quantile(0.5),
            ttft_p99_s=progress.ttft.quantile(0.99),
            tpot_p50_s=progress.tpot.quantile(0.5),
            tpot_p99_s=progress.tpot.quantile(0.99),
            server=server,
        )
