"""The interval of a phase's margin under a load profile: paired over the windows both arms share, resampled in
blocks because neighbouring windows of one stretch of time move together."""

from __future__ import annotations

import numpy as np
import pytest

from rig.analysis.phase_interval import MIN_WINDOWS, block_interval, shared_windows
from rig.analysis.prove import _phase_band

STATICS = {"steps 0", "steps 4"}


def _series(n: int, level: float, seed: int, drift: float = 0.0) -> np.ndarray:
    """Windows of tok/s around ``level`` with noise and, with ``drift``, a slow wander that neighbours share."""
    rng = np.random.default_rng(seed)
    wander = np.cumsum(rng.normal(0, drift, n)) if drift else np.zeros(n)
    return level * (1 + wander + rng.normal(0, 0.01, n))


def test_only_windows_both_arms_count_as_steady_are_paired():
    a, b = shared_windows({0.0: 1.0, 5.0: 2.0, 10.0: 3.0}, {5.0: 20.0, 10.0: 30.0, 15.0: 40.0})
    assert a.tolist() == [2.0, 3.0] and b.tolist() == [20.0, 30.0]


def test_an_arm_ten_percent_faster_in_every_window_is_told_apart_and_the_interval_holds_its_margin():
    best = _series(24, 1000.0, 1)
    arm = best * 1.10 * (1 + np.random.default_rng(2).normal(0, 0.005, best.size))
    margin = float(arm.sum() / best.sum() - 1)
    lo, hi, method = block_interval(arm, best, margin, np.random.default_rng(0), 2000)
    assert 0.05 < lo <= margin <= hi < 0.15, (lo, margin, hi)
    assert method == "paired windows (block bootstrap: 24 windows, blocks of 3)"  # ceil(24 ** (1/3))


def test_equal_arms_give_an_interval_around_zero():
    best = _series(30, 500.0, 3)
    arm = _series(30, 500.0, 4)
    margin = float(arm.sum() / best.sum() - 1)
    lo, hi, _ = block_interval(arm, best, margin, np.random.default_rng(0), 2000)
    assert lo < 0 < hi and hi - lo < 0.05


def test_windows_that_wander_together_widen_the_interval_against_single_window_resampling():
    # both arms drift with the same slow wander of load (shared), each with its own slow wander on top: single
    # windows resampled independently would pretend 40 samples; blocks keep the neighbours' dependence
    rng = np.random.default_rng(7)
    shared = np.cumsum(rng.normal(0, 0.03, 40))
    best = 1000 * (1 + shared + np.cumsum(rng.normal(0, 0.02, 40)))
    arm = 1000 * (1 + shared + np.cumsum(rng.normal(0, 0.02, 40)))
    margin = float(arm.sum() / best.sum() - 1)
    lo, hi, _ = block_interval(arm, best, margin, np.random.default_rng(0), 4000)
    iid = np.random.default_rng(0).integers(0, 40, size=(4000, 40))
    r = arm[iid].sum(axis=1) / best[iid].sum(axis=1) - 1
    iid_lo, iid_hi = np.percentile(r, [2.5, 97.5])
    assert hi - lo > 1.2 * (iid_hi - iid_lo), (hi - lo, iid_hi - iid_lo)


def test_too_few_windows_give_no_interval():
    x = np.ones(MIN_WINDOWS - 1)
    assert block_interval(x, x, 0.0, np.random.default_rng(0), 100) is None
    assert block_interval(np.ones(8), np.zeros(8), 0.0, np.random.default_rng(0), 100) is None  # nothing to divide by


def test_a_phase_is_judged_on_its_interval_where_the_windows_allow_and_on_its_margin_where_not():
    steady = {float(5 * k): v for k, v in enumerate(_series(12, 190.0, 5))}
    close = {t: v * 0.99 for t, v in steady.items()}  # 1 % behind the best static in every window
    wide = {t: v * (0.99 + (0.2 if k % 2 else -0.2)) for k, (t, v) in enumerate(steady.items())}  # 20 % either way
    windows = {"steps 4": steady, "adaptive": close, "noisy": wide, "steps 0": {}}
    figures = {"steps 0": 100.0, "steps 4": 190.0, "adaptive": 188.1, "noisy": 188.1, "short": 188.1}
    band = _phase_band("w", 0, "1:60s", figures, STATICS, {}, 0.02, windows, np.random.default_rng(0), 2000)
    adaptive, noisy, short = band.arms["adaptive"], band.arms["noisy"], band.arms["short"]
    assert band.best_static == "steps 4"
    assert adaptive.verdict == "as good" and -0.02 <= adaptive.ci_low <= adaptive.margin <= adaptive.ci_high < 0
    assert adaptive.ci_method.startswith("paired windows")
    assert noisy.verdict == "undecided" and noisy.ci_low < -0.02 < 0 < noisy.ci_high  # too wide to say
    # no windows of its own: the margin against the tolerance, as before, and the method says there is no interval
    assert short.verdict == "as good" and short.ci_low is None and "no interval" in short.ci_method
    assert short.margin == pytest.approx(188.1 / 190 - 1)
