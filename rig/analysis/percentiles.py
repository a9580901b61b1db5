"""Latency distributions per point: TTFT, TPOT, ITL, E2E (and, open loop, from the intended send and slip)."""

from __future__ import annotations

import numpy as np

from rig.analysis import metrics as m
from rig.analysis.rows import LatencyRow
from rig.analysis.runs import PointInfo, Run, point_files, read_request_files

# The rows of the latency table, in order; values in milliseconds.
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e")
OPEN_LOOP_METRICS = ("ttft_from_intended", "e2e_from_intended", "slip")


def read_itl(run: Run, p: PointInfo) -> tuple[np.ndarray, np.ndarray]:
    """ITL values and token weights of the point's ok requests (unsorted: the percentiles sort a copy)."""
    # Masked by ok in numpy (filtering list columns in Arrow copies every list), one part file at a time: a
    # 100 M-record point's lists are 240 MB, its ITL values a third of that.
    values, weights = [], []
    skip = run.skipped(p)
    for f in point_files(run.run_dir, p.point):
        t = read_request_files([f], ["ok", *m.ITL_COLUMNS], on_skip=skip)
        v, w = m.itl_values(t["chunk_offsets_s"], t["chunk_tokens"], m.as_bool(t["ok"]))
        values.append(v)
        weights.append(w)
    if not values:
        return np.empty(0), np.empty(0)
    return np.concatenate(values), np.concatenate(weights)


def _ms(seconds: float | None) -> float | None:
    return seconds * 1e3 if seconds is not None else None


def latency_rows(p: PointInfo, r: m.Requests, itl: tuple[np.ndarray, np.ndarray] | None) -> list[LatencyRow]:
    """One row per latency metric of a point: n, mean and p50/p90/p95/p99, in milliseconds (n in requests or tokens)."""
    ok = r.ok
    values: dict[str, tuple[np.ndarray, np.ndarray | None]] = {
        "ttft": (r.ttft[ok], None),
        "tpot": (r.tpot[ok], None),
        "e2e": (r.e2e[ok], None),
    }
    if itl is not None:
        values["itl"] = itl
    if p.open_loop:
        values["ttft_from_intended"] = (r.ttft_from_intended[ok], None)
        values["e2e_from_intended"] = (r.e2e_from_intended[ok], None)
        values["slip"] = (r.slip, None)  # every sent request slipped or not, whatever its outcome
    rows = []
    for name in LATENCY_METRICS + OPEN_LOOP_METRICS:
        if name not in values:
            continue
        s = m.summarize(*values[name])
        rows.append(
            LatencyRow(
                point=p.point,
                metric=name,
                n=s.n,
                mean_ms=_ms(s.mean),
                p50_ms=_ms(s.p50),
                p90_ms=_ms(s.p90),
                p95_ms=_ms(s.p95),
                p99_ms=_ms(s.p99),
            )
        )
    return rows


def cdf_points(
    values: np.ndarray, weights: np.ndarray | None = None, n: int = 200, presorted: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(x, F(x)) at n quantiles, enough to draw a CDF without plotting every request."""
    qs = np.linspace(0, 100, n)
    xs = m.weighted_percentiles(values, weights, qs, presorted)
    if not xs or xs[0] is None:
        return np.empty(0), np.empty(0)
    return np.asarray(xs, dtype=float), qs / 100.0
