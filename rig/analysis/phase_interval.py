"""The interval of one phase's margin under a load profile: arm / best static - 1 over the steady windows both
points share, with a paired moving-block bootstrap.

The windows of one phase are one stretch of time, so neighbouring windows are not independent samples (a server's
queue carries over from one window to the next): resampling single windows would make the interval too narrow.
Blocks of ``ceil(n ** (1/3))`` consecutive windows keep that dependence (Künsch's moving-block bootstrap, the usual
length for a mean); the two arms are resampled at the same window indices, because both ran the same profile on the
same clock offsets from its start (window k of each is the same stretch of the profile). Fewer than MIN_WINDOWS
shared windows give no interval."""

from __future__ import annotations

import math

import numpy as np

MIN_WINDOWS = 4


def shared_windows(arm: dict[float, float], best: dict[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """The tok/s of both sides over the windows (by start, seconds into the profile) that both count as steady."""
    starts = sorted(set(arm) & set(best))
    return np.array([arm[s] for s in starts], dtype=float), np.array([best[s] for s in starts], dtype=float)


def block_interval(
    arm: np.ndarray, best: np.ndarray, margin: float, rng: np.random.Generator, resamples: int
) -> tuple[float, float, str] | None:
    """The 95 % interval of ``margin`` (the phase's own figures: arm / best - 1 over each point's steady span) from a
    paired moving-block bootstrap of sum(arm) / sum(best) - 1 over the shared windows, its percentiles moved by the
    gap between ``margin`` and the windows' own ratio (the spans' edges fall inside windows), and how it was made;
    None with fewer than MIN_WINDOWS windows or no tokens on the best side."""
    n = int(arm.size)
    if n < MIN_WINDOWS or not np.sum(best) > 0:
        return None
    length = math.ceil(n ** (1 / 3))
    blocks = math.ceil(n / length)
    starts = rng.integers(0, n - length + 1, size=(resamples, blocks))
    idx = (starts[:, :, None] + np.arange(length)[None, None, :]).reshape(resamples, -1)[:, :n]
    den = best[idx].sum(axis=1)
    ratios = arm[idx].sum(axis=1) / np.where(den > 0, den, np.nan) - 1
    ratios = ratios[np.isfinite(ratios)]
    if ratios.size == 0:
        return None
    shift = margin - (float(arm.sum()) / float(best.sum()) - 1)
    lo, hi = np.percentile(ratios, [2.5, 97.5]) + shift
    return float(lo), float(hi), f"paired windows (block bootstrap: {n} windows, blocks of {length})"
