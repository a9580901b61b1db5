"""Arrival schedules: offsets in seconds from a level's start, computed ahead (never while sending).

Pure functions of their arguments and a seed (an int or a numpy Generator). Random schedules are built from
unit-mean gaps scaled by ``1 / rate``, so with one seed the schedules at different rates are scaled copies of each
other (sweep points pair up arrival by arrival) and the first n offsets never depend on how many were asked for.

* ``poisson``: exponential gaps (coefficient of variation 1).
* ``gamma``: gamma gaps with shape ``1 / cv**2`` and mean ``1 / rate``: ``cv`` > 1 is burstier than Poisson, < 1
  smoother, ``cv = 1`` is exactly Poisson's exponential. vLLM's ``--burstiness`` is the gamma *shape*; convert with
  ``cv_from_burstiness``.
* ``constant``: evenly spaced.
* ``trace``: recorded timestamps, relative to the first, divided by a speed factor (2.0 replays twice as fast).

The first arrival is at offset 0 (the level starts with a request rather than an idle gap); later ones follow the
gaps. For a duration, offsets are those in [0, duration_s). The driver computes one global schedule and hands each
generator its round-robin slice (``split``), offsets unchanged, so the union of the slices is the schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Pattern = Literal["poisson", "gamma", "constant"]
MAX_ARRIVALS = 10_000_000  # a guard against rate x duration typos eating memory


@dataclass(frozen=True)
class Slice:
    """One generator's share of a schedule: global request indices and their offsets from the level start."""

    generator: int
    indices: np.ndarray  # int64, increasing
    offsets: np.ndarray  # float64 seconds, non-decreasing


def _rng(seed: int | np.random.Generator) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"arrival seed must be an integer >= 0 or a numpy Generator (got {seed!r})")
    return np.random.default_rng(int(seed))


def _check_rate(rate: float) -> float:
    if (
        isinstance(rate, bool)
        or not isinstance(rate, (int, float, np.floating, np.integer))
        or not math.isfinite(rate)
        or not 1e-9 <= rate <= 1e9
    ):
        # Outside these bounds offsets overflow or collapse to zero: a unit mistake, not a load pattern.
        raise ValueError(f"arrival rate must be a finite number > 0 requests/s, within [1e-9, 1e9] (got {rate!r})")
    return float(rate)


def _check_bounds(n: int | None, duration_s: float | None) -> None:
    if (n is None) == (duration_s is None):
        raise ValueError("give exactly one of n (a request count) or duration_s")
    if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= MAX_ARRIVALS):
        raise ValueError(f"arrival count n must be an integer in [0, {MAX_ARRIVALS}] (got {n!r})")
    if duration_s is not None and (
        isinstance(duration_s, bool)
        or not isinstance(duration_s, (int, float))
        or not math.isfinite(duration_s)
        or duration_s <= 0
    ):
        raise ValueError(f"arrival duration_s must be a finite number > 0 (got {duration_s!r})")


def cv_from_burstiness(burstiness: float) -> float:
    """vLLM's gamma shape ("burstiness", 1 = Poisson, lower = burstier) as a coefficient of variation."""
    if not math.isfinite(burstiness) or burstiness <= 0:
        raise ValueError(f"burstiness must be a finite number > 0 (got {burstiness!r})")
    return 1.0 / math.sqrt(burstiness)


def _from_unit_gaps(
    draw: Callable[[int], np.ndarray], rate: float, n: int | None, duration_s: float | None
) -> np.ndarray:
    """Offsets from unit-mean gaps: the first at 0, then cumulative gaps / rate; for n or for [0, duration_s)."""
    if n is not None:
        if n == 0:
            return np.zeros(0)
        return np.concatenate(([0.0], np.cumsum(draw(n - 1)) / rate))
    assert duration_s is not None
    expected = rate * duration_s
    if expected > MAX_ARRIVALS:
        raise ValueError(f"rate x duration_s = {expected:.0f} arrivals exceeds the limit of {MAX_ARRIVALS}")
    # Draw in blocks (sized for the expected count plus a margin) until past the end; sequential draws from one
    # generator equal one big draw, so the result is the same as for n = the count that fits.
    gaps: list[np.ndarray] = []
    total = 0.0
    block = int(expected + 5 * math.sqrt(expected) + 16)
    while total < duration_s * rate:
        g = draw(block)
        gaps.append(g)
        total += float(g.sum())
    offsets = np.concatenate(([0.0], np.cumsum(np.concatenate(gaps)) / rate))
    return offsets[offsets < duration_s]


def poisson(
    rate: float, *, n: int | None = None, duration_s: float | None = None, seed: int | np.random.Generator = 0
) -> np.ndarray:
    """Poisson arrivals at ``rate`` per second: exponential gaps of mean 1 / rate."""
    rate = _check_rate(rate)
    _check_bounds(n, duration_s)
    rng = _rng(seed)
    return _from_unit_gaps(rng.standard_exponential, rate, n, duration_s)


def gamma(
    rate: float,
    cv: float,
    *,
    n: int | None = None,
    duration_s: float | None = None,
    seed: int | np.random.Generator = 0,
) -> np.ndarray:
    """Gamma arrivals: gaps of mean 1 / rate and coefficient of variation ``cv`` (shape 1 / cv**2)."""
    rate = _check_rate(rate)
    _check_bounds(n, duration_s)
    if isinstance(cv, bool) or not isinstance(cv, (int, float)) or not math.isfinite(cv) or not 0.01 <= cv <= 100:
        raise ValueError(f"arrival cv (burstiness) must be a number in [0.01, 100] (got {cv!r})")
    shape = 1.0 / (cv * cv)
    rng = _rng(seed)
    return _from_unit_gaps(lambda k: rng.standard_gamma(shape, k) / shape, rate, n, duration_s)


def constant(rate: float, *, n: int | None = None, duration_s: float | None = None) -> np.ndarray:
    """Evenly spaced arrivals, 1 / rate apart, the first at 0."""
    rate = _check_rate(rate)
    _check_bounds(n, duration_s)
    if n is None:
        assert duration_s is not None
        if rate * duration_s > MAX_ARRIVALS:
            raise ValueError(
                f"rate x duration_s = {rate * duration_s:.0f} arrivals exceeds the limit of {MAX_ARRIVALS}"
            )
        n = int(math.ceil(rate * duration_s))
        offsets = np.arange(n) / rate
        return offsets[offsets < duration_s]
    return np.arange(n) / rate


def trace(timestamps: Sequence[float] | np.ndarray, speed: float = 1.0) -> np.ndarray:
    """Recorded timestamps (seconds, non-decreasing) as offsets from the first, divided by ``speed``."""
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not math.isfinite(speed) or speed <= 0:
        raise ValueError(f"trace speed must be a finite number > 0 (got {speed!r})")
    try:
        ts = np.asarray(timestamps, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("trace timestamps must be numbers") from None
    if ts.ndim != 1:
        raise ValueError(f"trace timestamps must be a flat list (got shape {ts.shape})")
    if ts.size == 0:
        return ts
    if not np.all(np.isfinite(ts)):
        raise ValueError(f"trace timestamp {int(np.argmin(np.isfinite(ts)))} is not a finite number")
    drops = np.flatnonzero(np.diff(ts) < 0)
    if drops.size:
        k = int(drops[0]) + 1
        raise ValueError(f"trace timestamp {k} ({ts[k]:g}) is earlier than timestamp {k - 1} ({ts[k - 1]:g})")
    return (ts - ts[0]) / float(speed)


def schedule(
    pattern: Pattern,
    rate: float,
    *,
    cv: float = 1.0,
    n: int | None = None,
    duration_s: float | None = None,
    seed: int | np.random.Generator = 0,
) -> np.ndarray:
    """One entry point for the driver: ``pattern`` at ``rate`` for ``n`` arrivals or ``duration_s`` seconds."""
    if pattern == "poisson":
        return poisson(rate, n=n, duration_s=duration_s, seed=seed)
    if pattern == "gamma":
        return gamma(rate, cv, n=n, duration_s=duration_s, seed=seed)
    if pattern == "constant":
        return constant(rate, n=n, duration_s=duration_s)
    raise ValueError(f"arrival pattern must be poisson, gamma or constant (got {pattern!r})")


def arrival_offsets(
    mode: str,
    *,
    rate: float,
    n: int | None = None,
    duration_s: float | None = None,
    seed: int | np.random.Generator = 0,
    burstiness: float = 1.0,
) -> np.ndarray:
    """``schedule`` under the run spec's names: ``mode`` poisson|gamma|constant, ``burstiness`` = the gamma CV."""
    return schedule(mode, rate, cv=burstiness, n=n, duration_s=duration_s, seed=seed)  # type: ignore[arg-type]


def trace_offsets(timestamps: Sequence[float] | np.ndarray, speed: float = 1.0) -> np.ndarray:
    """``trace`` under the runner's name."""
    return trace(timestamps, speed)


def split(offsets: np.ndarray | Sequence[float], k: int) -> list[Slice]:
    """Round-robin slices for ``k`` generators: generator g gets indices g, g+k, ...; offsets stay absolute."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"generator count must be an integer >= 1 (got {k!r})")
    arr = np.asarray(offsets, dtype=np.float64)
    idx = np.arange(arr.size, dtype=np.int64)
    return [Slice(g, idx[g::k], arr[g::k]) for g in range(int(k))]


def stats(offsets: np.ndarray) -> dict[str, float]:
    """Achieved rate, mean gap and coefficient of variation of gaps (for checks and reports)."""
    gaps = np.diff(np.asarray(offsets, dtype=np.float64))
    if gaps.size == 0:
        return {"n": float(len(offsets)), "rate": float("nan"), "mean_gap": float("nan"), "cv": float("nan")}
    mean = float(gaps.mean())
    return {
        "n": float(len(offsets)),
        "rate": 1.0 / mean if mean > 0 else float("inf"),
        "mean_gap": mean,
        "cv": float(gaps.std() / mean) if mean > 0 else float("nan"),
    }


def profile_offsets(
    mode: str, phases: Sequence[tuple[float, float, float]], *, seed: int | np.random.Generator = 0, cv: float = 1.0
) -> np.ndarray:
    """Arrivals over a load profile of (rate at start, rate at end, duration) phases: a unit-rate process of the
    pattern (the same gaps ``schedule`` scales) mapped through the inverse of the cumulative intensity (time
    rescaling), so a constant phase is ``schedule`` at its rate and a linear ramp's rate grows along it."""
    if not phases:
        return np.zeros(0)
    ends = np.cumsum([0.0] + [(r0 + r1) / 2 * d for r0, r1, d in phases])  # expected arrivals by each phase's end
    if ends[-1] <= 0:
        return np.zeros(0)
    unit = schedule(mode, 1.0, cv=cv, duration_s=float(ends[-1]), seed=seed)  # type: ignore[arg-type]
    starts = np.cumsum([0.0] + [d for _, _, d in phases])
    out = np.empty_like(unit)
    which = np.clip(np.searchsorted(ends, unit, side="right") - 1, 0, len(phases) - 1)
    for i, (r0, r1, d) in enumerate(phases):
        mask = which == i
        u = unit[mask] - ends[i]  # arrivals into phase i, in its own intensity
        a = (r1 - r0) / (2 * d)  # Lambda(t) = r0 t + a t^2 on [0, d]; its inverse, written to stay finite at a = 0
        den = r0 + np.sqrt(np.maximum(r0 * r0 + 4 * a * u, 0.0))
        out[mask] = starts[i] + np.divide(2 * u, den, out=np.zeros_like(u), where=den > 0)
    return out[out < starts[-1]]
