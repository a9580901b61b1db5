"""The report's exact percentiles by selection and by sort give numpy's numbers (rig.analysis.metrics)."""

from __future__ import annotations

import numpy as np
import pytest

from rig.analysis import metrics as m


@pytest.mark.parametrize("seed", range(20))
def test_order_statistics_are_those_of_a_sort(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    a = rng.integers(0, 20, n).astype(float) if seed % 2 else rng.normal(size=n)  # ties on odd seeds
    ks = rng.integers(0, n, int(rng.integers(1, 9))).tolist() + [n - 1]
    want = np.sort(a)
    got = m.order_statistics(a.copy(), ks)
    assert got == {k: want[k] for k in ks}


@pytest.mark.parametrize("seed", range(10))
def test_percentiles_equal_numpys_exactly(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 2000))
    v = rng.gamma(2.0, 0.05, n)
    v[rng.random(n) < 0.05] = np.nan
    w = rng.integers(1, 5, n)
    fin = v[np.isfinite(v)]
    s = m.summarize(v)
    assert [s.p50, s.p90, s.p95, s.p99] == [float(x) for x in np.percentile(fin, m.PERCENTILES)]
    expanded = np.repeat(v, w)
    expanded = expanded[np.isfinite(expanded)]
    got = m.weighted_percentiles(v, w, [0, 1, 50, 90, 95, 99, 100])
    assert got == pytest.approx(list(np.percentile(expanded, [0, 1, 50, 90, 95, 99, 100])), rel=1e-12)
    assert got == m.weighted_percentiles(*m.sort_weighted(v, w), [0, 1, 50, 90, 95, 99, 100], presorted=True)
