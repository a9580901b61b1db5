"""Arrival schedules: Poisson and gamma statistics, determinism, duration bounds, trace speed, generator split."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rig.loadgen import arrivals


def _gaps(offsets: np.ndarray) -> np.ndarray:
    return np.diff(offsets)


def test_poisson_mean_and_cv() -> None:
    n, rate = 40_000, 5.0
    off = arrivals.poisson(rate, n=n, seed=1)
    gaps = _gaps(off)
    assert off[0] == 0.0 and len(off) == n and np.all(gaps >= 0)
    # Exponential gaps: SE of the mean is (1/rate)/sqrt(n) = 0.5 %, of the CV about 1/sqrt(n) = 0.5 %.
    assert abs(gaps.mean() * rate - 1) < 0.02
    assert abs(gaps.std() / gaps.mean() - 1) < 0.03
    # Memorylessness check: P(gap > mean) = e^-1.
    assert abs(np.mean(gaps > 1 / rate) - math.exp(-1)) < 0.01


@pytest.mark.parametrize("cv, tol", [(0.25, 0.02), (0.5, 0.03), (1.0, 0.03), (2.0, 0.06), (3.0, 0.1)])
def test_gamma_cv_matches_burstiness(cv: float, tol: float) -> None:
    n, rate = 100_000, 20.0
    gaps = _gaps(arrivals.gamma(rate, cv, n=n, seed=2))
    assert abs(gaps.mean() * rate - 1) < 0.03
    assert abs(gaps.std() / gaps.mean() / cv - 1) < tol


def test_gamma_cv1_is_exponential() -> None:
    gaps = _gaps(arrivals.gamma(2.0, 1.0, n=40_000, seed=3))
    assert abs(np.mean(gaps > 0.5) - math.exp(-1)) < 0.01
    assert arrivals.cv_from_burstiness(1.0) == 1.0 and arrivals.cv_from_burstiness(0.25) == 2.0


def test_constant() -> None:
    assert np.allclose(arrivals.constant(4.0, n=5), [0, 0.25, 0.5, 0.75, 1.0])
    assert np.allclose(arrivals.constant(2.0, duration_s=2.0), [0, 0.5, 1.0, 1.5])


@pytest.mark.parametrize("pattern", ["poisson", "gamma"])
def test_seeded_prefix_stable_and_scaled_across_rates(pattern: str) -> None:
    a = arrivals.schedule(pattern, 3.0, cv=2.0, n=500, seed=9)
    assert np.array_equal(a, arrivals.schedule(pattern, 3.0, cv=2.0, n=500, seed=9))
    assert np.array_equal(arrivals.schedule(pattern, 3.0, cv=2.0, n=800, seed=9)[:500], a)
    assert not np.array_equal(a, arrivals.schedule(pattern, 3.0, cv=2.0, n=500, seed=10))
    # Same seed, other rate: the same schedule scaled, so sweep points pair arrival by arrival.
    assert np.allclose(arrivals.schedule(pattern, 6.0, cv=2.0, n=500, seed=9) * 2, a)
    # A Generator works as the seed too.
    assert np.array_equal(arrivals.schedule(pattern, 3.0, cv=2.0, n=500, seed=np.random.default_rng(9)), a)


@pytest.mark.parametrize("pattern", ["poisson", "gamma", "constant"])
def test_duration_bound(pattern: str) -> None:
    rate, dur = 50.0, 200.0
    off = arrivals.schedule(pattern, rate, cv=1.5, duration_s=dur, seed=4)
    assert off.max() < dur and off[0] == 0
    expected = rate * dur
    assert abs(len(off) - expected) < 5 * math.sqrt(expected) * 1.5 + 1
    # The same offsets as a count-bounded schedule of that length.
    if pattern != "constant":
        assert np.array_equal(off, arrivals.schedule(pattern, rate, cv=1.5, n=len(off), seed=4))
        nxt = arrivals.schedule(pattern, rate, cv=1.5, n=len(off) + 1, seed=4)[-1]
        assert nxt >= dur


def test_runner_entry_points() -> None:
    """The names the runner calls: arrival_offsets(mode, rate=, n=, seed=, burstiness=) and trace_offsets."""
    a = arrivals.arrival_offsets("gamma", rate=2.0, n=100, seed=1, burstiness=2.0)
    assert np.array_equal(a, arrivals.gamma(2.0, 2.0, n=100, seed=1))
    assert np.array_equal(arrivals.trace_offsets([5, 6, 9], speed=2.0), [0, 0.5, 2.0])


def test_trace_speed() -> None:
    ts = [100.0, 100.5, 100.5, 103.0]
    assert np.allclose(arrivals.trace(ts), [0, 0.5, 0.5, 3.0])
    assert np.allclose(arrivals.trace(ts, speed=2.0), [0, 0.25, 0.25, 1.5])
    assert np.allclose(arrivals.trace(ts, speed=0.5), [0, 1.0, 1.0, 6.0])
    assert arrivals.trace([]).size == 0
    with pytest.raises(ValueError, match=r"^trace timestamp 2 \(1\) is earlier than timestamp 1 \(3\)$"):
        arrivals.trace([0, 3, 1])


@pytest.mark.parametrize("k", [1, 2, 3, 7, 50])
def test_split_sums_to_the_whole(k: int) -> None:
    off = arrivals.poisson(10.0, n=23, seed=0)
    slices = arrivals.split(off, k)
    assert [s.generator for s in slices] == list(range(k))
    assert sum(len(s.indices) for s in slices) == 23
    idx = np.concatenate([s.indices for s in slices])
    assert sorted(idx.tolist()) == list(range(23))
    for s in slices:
        assert np.array_equal(s.indices, np.arange(s.generator, 23, k))
        assert np.array_equal(s.offsets, off[s.indices])  # absolute offsets kept
    merged = np.sort(np.concatenate([s.offsets for s in slices]))
    assert np.array_equal(merged, off)


@pytest.mark.parametrize(
    "call, msg",
    [
        (lambda: arrivals.poisson(0, n=3), "arrival rate must be a finite number > 0"),
        (lambda: arrivals.poisson(1e-300, n=3), "arrival rate must be a finite number > 0"),
        (lambda: arrivals.poisson(float("nan"), n=3), "arrival rate must be a finite number > 0"),
        (lambda: arrivals.poisson(1.0), "give exactly one of n"),
        (lambda: arrivals.poisson(1.0, n=3, duration_s=2), "give exactly one of n"),
        (lambda: arrivals.poisson(1.0, n=-1), "arrival count n must be"),
        (lambda: arrivals.poisson(1.0, duration_s=-1), "arrival duration_s must be"),
        (lambda: arrivals.poisson(1e6, duration_s=1e6), "exceeds the limit"),
        (lambda: arrivals.gamma(1.0, 0, n=3), "arrival cv"),
        (lambda: arrivals.poisson(1.0, n=3, seed=-2), "arrival seed"),
        (lambda: arrivals.trace([1, 2], speed=0), "trace speed"),
        (lambda: arrivals.trace([1, float("inf")]), "trace timestamp 1 is not a finite number"),
        (lambda: arrivals.split([1.0], 0), "generator count"),
        (lambda: arrivals.schedule("ramp", 1.0, n=2), "arrival pattern must be"),  # type: ignore[arg-type]
    ],
)
def test_errors_are_one_line(call, msg: str) -> None:
    with pytest.raises(ValueError) as e:
        call()
    assert msg in str(e.value) and "\n" not in str(e.value)


@settings(max_examples=150, deadline=None)
@given(
    pattern=st.sampled_from(["poisson", "gamma", "constant"]),
    rate=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-3, 10**4),
        st.floats(1e-12, 1e-6),
        st.floats(1e8, 1e10),
    ),
    cv=st.floats(-1, 200),
    n=st.integers(-2, 2000),
    seed=st.integers(-1, 2**40),
)
def test_random_arguments_schedule_or_value_error(pattern: str, rate: float, cv: float, n: int, seed: int) -> None:
    try:
        off = arrivals.schedule(pattern, rate, cv=cv, n=n, seed=seed)  # type: ignore[arg-type]
    except ValueError as e:
        assert "\n" not in str(e)
        return
    assert len(off) == n
    assert np.all(np.diff(off) >= 0) and (n == 0 or off[0] == 0.0) and np.all(np.isfinite(off))
