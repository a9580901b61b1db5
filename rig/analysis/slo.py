"""Whether a point meets a set of SLOs at a percentile, and by what margin (the SLO search's and tune's verdict).

A point meets ``ttft<=500ms`` at percentile P when the P-th percentile of TTFT over its counted requests (ok and
failed; cancelled ones are left out, as for goodput) is within the limit. A failed request counts as infinitely
slow, so errors push the percentile over any limit once they exceed 100 - P percent of the requests. A request with
one token has no TPOT and counts as meeting a TPOT SLO (as in ``metrics.goodput``). Percentiles are numpy's linear
interpolation, like every percentile of the rig. The margin of an SLO is (limit - value) / limit: positive is
headroom, negative the share by which the point misses; a point's margin is its smallest.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rig.analysis import metrics as m

DEFAULT_PERCENTILE = 99.0
_FAILED = 1e12  # stands in for "never": finite, so linear interpolation stays defined


def slo_values(r: m.Requests, metric: str) -> np.ndarray:
    """The metric of every counted request, failed ones as effectively infinite."""
    values = {"ttft": r.ttft, "tpot": r.tpot, "e2e": r.e2e}[metric]
    counted = ~r.cancelled | r.ok
    v = np.where(r.ok, values, _FAILED)
    if metric == "tpot":
        v = np.where(r.ok & np.isnan(values), 0.0, v)  # one token: no TPOT, passes
    v = np.where(r.ok & np.isnan(v), _FAILED, v)  # an ok request without the timestamp cannot be shown to pass
    return v[counted]


def evaluate_slos(r: m.Requests, slos: list[m.Slo], percentile: float = DEFAULT_PERCENTILE) -> dict[str, Any]:
    """{meets, margin, per_slo: [{slo, value_s, limit_s, margin, meets}], requests} for one point's requests."""
    per: list[dict[str, Any]] = []
    for s in slos:
        v = slo_values(r, s.metric)
        value = float(np.percentile(v, percentile)) if v.size else None
        margin = (s.limit_s - value) / s.limit_s if value is not None else None
        per.append({"slo": str(s), "metric": s.metric, "limit_s": s.limit_s,
                    "value_s": value if value is None or value < _FAILED else None,
                    "margin": margin if value is None or value < _FAILED else -1.0,  # margin is None iff value is
                    "meets": value is not None and value <= s.limit_s})
    margins = [p["margin"] for p in per if p["margin"] is not None]
    return {
        "meets": bool(per) and all(p["meets"] for p in per),
        "margin": min(margins) if len(margins) == len(per) and margins else None,
        "percentile": percentile,
        "requests": int(r.n),
        "per_slo": per,
    }


def describe(slos: list[m.Slo], percentile: float) -> str:
    """'p99 ttft<=500ms, tpot<=50ms'."""
    return f"p{percentile:g} " + ", ".join(str(s) for s in slos)
