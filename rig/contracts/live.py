"""What the driver learns while a level runs, for the live view: a generator's progress (its counters and two
fixed-size latency sketches) and the server's latest gauges. Nothing here is a measurement the report uses; the
report recomputes every figure from the Parquet."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Latency sketch: counts in log-spaced buckets from 0.1 ms up (each 8 % wider than the one below, so a quantile read
# back is within 4 % of the true order statistic), the last bucket open-ended (over ~43 min). Fixed size: a
# generator's progress answer weighs the same after ten requests as after ten million.
SKETCH_MIN_S = 1e-4
SKETCH_GROWTH = 1.08
SKETCH_BUCKETS = 224
_LOG_GROWTH = math.log(SKETCH_GROWTH)

# The server gauges the live view shows, under the names each engine publishes them (the first present wins)
RUNNING_GAUGES = ("sglang:num_running_reqs", "vllm:num_requests_running")
QUEUED_GAUGES = ("sglang:num_queue_reqs", "vllm:num_requests_waiting")
SPEC_STEPS_GAUGES = ("sglang:spec_num_steps",)  # the active speculative steps (SGLang's metrics collector)
GEN_THROUGHPUT_GAUGES = ("sglang:gen_throughput",)
LIVE_GAUGES = RUNNING_GAUGES + QUEUED_GAUGES + SPEC_STEPS_GAUGES + GEN_THROUGHPUT_GAUGES


def sketch_bucket(seconds: float) -> int:
    """The bucket of a latency (values at or below SKETCH_MIN_S fall in the first)."""
    if not seconds > SKETCH_MIN_S:  # also NaN
        return 0
    return min(SKETCH_BUCKETS - 1, 1 + int(math.log(seconds / SKETCH_MIN_S) / _LOG_GROWTH))


def bucket_value(index: int) -> float:
    """A bucket's representative latency: the geometric middle of its bounds."""
    if index == 0:
        return SKETCH_MIN_S
    return float(SKETCH_MIN_S * SKETCH_GROWTH ** (index - 0.5))


@dataclass
class LatencySketch:
    """A fixed-size histogram of latencies in log-spaced buckets: O(1) to add to, exact to merge."""

    counts: list[int] = field(default_factory=lambda: [0] * SKETCH_BUCKETS)

    def add(self, seconds: float) -> None:
        self.counts[sketch_bucket(seconds)] += 1

    @property
    def n(self) -> int:
        return sum(self.counts)

    def merge(self, other: LatencySketch) -> None:
        for i, c in enumerate(other.counts):
            if c:
                self.counts[i] += c

    def quantile(self, q: float) -> float | None:
        """The latency below which a fraction ``q`` of the values lie (to the sketch's resolution); None if empty."""
        n = self.n
        if n == 0:
            return None
        rank = max(1, math.ceil(q * n))  # the nearest-rank order statistic
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                return bucket_value(i)
        return bucket_value(SKETCH_BUCKETS - 1)


@dataclass
class GeneratorProgress:
    """A generator's share of the running level: its counters (scheduled, ok, failed, cancelled, in_flight,
    tokens, ...) and the TTFT and TPOT of its successful requests so far."""

    counts: dict[str, int] = field(default_factory=dict)
    ttft: LatencySketch = field(default_factory=LatencySketch)
    tpot: LatencySketch = field(default_factory=LatencySketch)

    def merge(self, other: GeneratorProgress) -> None:
        for k, v in other.counts.items():
            self.counts[k] = self.counts.get(k, 0) + v
        self.ttft.merge(other.ttft)
        self.tpot.merge(other.tpot)


class RequestLatencies:
    """A generator's sketches of its successful requests' TTFT and TPOT while a level runs (one O(1) add each)."""

    def __init__(self) -> None:
        self.ttft = LatencySketch()
        self.tpot = LatencySketch()

    def add(self, ttft_s: float | None, e2e_s: float, tokens: int) -> None:
        if ttft_s is None:
            return
        self.ttft.add(ttft_s)
        if tokens > 1:
            self.tpot.add((e2e_s - ttft_s) / (tokens - 1))

    def snapshot(self, counts: dict[str, int]) -> GeneratorProgress:
        """The counters and copies of the sketches (the level goes on adding to its own)."""
        return GeneratorProgress(
            dict(counts), LatencySketch(list(self.ttft.counts)), LatencySketch(list(self.tpot.counts))
        )


@dataclass
class ServerGauges:
    """The server's latest /metrics gauges and GPU power, as its actor last saw them (None: not reported)."""

    running: float | None = None
    queued: float | None = None
    spec_steps: float | None = None
    gen_throughput: float | None = None
    power_w: float | None = None
    age_s: float | None = None  # how old the scrape was when asked


def first_present(values: dict[str, float], names: tuple[str, ...]) -> float | None:
    """The value of the first of ``names`` present in ``values``."""
    return next((values[n] for n in names if n in values), None)
