"""Bootstraps that cost what they need, not what the run holds.

A resample draws m = min(n, ``BOOTSTRAP_DRAWS``) items with replacement from the n observed. Up to BOOTSTRAP_DRAWS
items that is the ordinary bootstrap, draw for draw. Beyond, it is the m-out-of-n bootstrap (Bickel, Götze & van Zwet
1997): each resampled statistic's deviation from the observed one is scaled by sqrt(m / n), the ratio of the two
sample sizes' standard errors, which is consistent for the smooth statistics rig resamples (means, ratios of sums,
percentiles of continuous latencies). The interval then costs resamples × m, not resamples × n: at 200,000 requests
a point, 40x less. Its bounds differ from the full bootstrap's by about as much as the full bootstrap's own bounds move
from one seed to the next (``benchmarks/report_scale.py --steps bootstrap`` prints both).
"""

from __future__ import annotations

import numpy as np

BOOTSTRAP_DRAWS = 5_000  # items one resample draws at most
BATCH_CELLS = 4_000_000  # resamples × draws per batch: bounds bootstrap memory


def draws(n: int) -> int:
    """Items one resample draws from ``n`` observed."""
    return min(n, BOOTSTRAP_DRAWS)


def shrink(stats: np.ndarray, observed: float, n: int, m: int) -> np.ndarray:
    """Statistics of resamples of m draws put on the scale of n: deviations from ``observed`` times sqrt(m / n)."""
    return stats if m >= n else observed + (stats - observed) * np.sqrt(m / n)


def subsample_note() -> str:
    """The warning a report or comparison carries when an interval came from the m-out-of-n bootstrap."""
    return (
        f"bootstrap intervals over more than {BOOTSTRAP_DRAWS:,} requests resample {BOOTSTRAP_DRAWS:,} of them at "
        "a time, their spread scaled by sqrt(m/n) (m-out-of-n bootstrap; README: Analysis at scale)"
    )
