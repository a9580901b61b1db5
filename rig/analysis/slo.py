"""Whether a point meets a set of SLOs at a percentile, and by what margin (the SLO search's and tune's verdict).

A point meets ``ttft<=500ms`` at percentile P when the P-th percentile of TTFT over its counted requests (ok and
failed; cancelled ones are left out by default, as for goodput) is within the limit. Leaving them out flatters an
overloaded point (requests cancelled at a level's end are its slowest), so ``cancelled="lower-bound"`` counts each
cancelled request that was sent at its known minimum: E2E = the time it ran before it was cancelled, TTFT = its
first token's time if one came, else that same running time; TPOT has no lower bound (the next token might have come
at once), so cancelled requests stay out of a TPOT SLO either way. A request never sent (e.g. a later turn of a
cancelled session) ran for no time and is left out. Every verdict says which way they were counted.

A failed request counts as infinitely slow, so errors push the percentile over any limit once they exceed 100 - P
percent of the requests. A request with one token has no TPOT and counts as meeting a TPOT SLO (as in
``metrics.goodput``). Percentiles are numpy's linear interpolation, like every percentile of the rig. The margin of
an SLO is (limit - value) / limit: positive is headroom, negative the share by which the point misses; a point's
margin is its smallest.
"""

from __future__ import annotations

import numpy as np

from rig.analysis import metrics as m
from rig.contracts import SloCheck, SloVerdict

DEFAULT_PERCENTILE = 99.0
_FAILED = 1e12  # stands in for "never": finite, so linear interpolation stays defined
CANCELLED_COUNTING = ("excluded", "lower-bound")  # how an SLO verdict counts cancelled requests


def slo_values(r: m.Requests, metric: str, cancelled: str = "excluded") -> np.ndarray:
    """The metric of every counted request, failed ones as effectively infinite (cancelled ones: see the module)."""
    values = {"ttft": r.ttft, "tpot": r.tpot, "e2e": r.e2e}[metric]
    counted = ~r.cancelled | r.ok
    v = np.where(r.ok, values, _FAILED)
    if metric == "tpot":
        v = np.where(r.ok & np.isnan(values), 0.0, v)  # one token: no TPOT, passes
    v = np.where(r.ok & np.isnan(v), _FAILED, v)  # an ok request without the timestamp cannot be shown to pass
    if cancelled == "lower-bound" and metric != "tpot":
        ran = np.nan_to_num(r.e2e, nan=0.0)
        sent = r.cancelled & ~r.ok & (ran > 0)
        low = ran if metric == "e2e" else np.where(np.isnan(r.ttft), ran, r.ttft)
        v = np.where(sent, low, v)
        counted = counted | sent
    return v[counted]


def cancelled_note(n_cancelled: int, cancelled: str) -> str:
    """How a verdict counted the point's cancelled requests, in a few words."""
    if not n_cancelled:
        return "no request cancelled"
    how = "left out" if cancelled == "excluded" else "counted at their lower bound"
    return f"{n_cancelled} cancelled request(s) {how}"


def evaluate_slos(
    r: m.Requests, slos: list[m.Slo], percentile: float = DEFAULT_PERCENTILE, cancelled: str = "excluded"
) -> SloVerdict:
    """Whether one point's requests meet every SLO at ``percentile``, with each SLO's value and margin
    (``cancelled``: one of CANCELLED_COUNTING)."""
    if cancelled not in CANCELLED_COUNTING:
        raise ValueError(f"cancelled requests are counted {' or '.join(CANCELLED_COUNTING)}, not {cancelled!r}")
    per: list[SloCheck] = []
    for s in slos:
        v = slo_values(r, s.metric, cancelled)
        value = float(m.percentiles_of(v, np.array([percentile]))[0]) if v.size else None  # v: a copy of its own
        margin = (s.limit_s - value) / s.limit_s if value is not None else None
        per.append(
            SloCheck.make(
                slo=str(s),
                metric=s.metric,
                limit_s=s.limit_s,
                value_s=value if value is None or value < _FAILED else None,
                margin=margin if value is None or value < _FAILED else -1.0,  # margin is None iff value is
                meets=value is not None and value <= s.limit_s,
            )
        )
    margins = [p.margin for p in per if p.margin is not None]
    n_cancelled = int((r.cancelled & ~r.ok).sum())
    return SloVerdict.make(
        meets=bool(per) and all(p.meets for p in per),
        margin=min(margins) if len(margins) == len(per) and margins else None,
        percentile=percentile,
        requests=int(r.n),
        per_slo=per,
        cancelled=n_cancelled,
        cancelled_counted=cancelled,
        note=cancelled_note(n_cancelled, cancelled),
    )


def describe(slos: list[m.Slo], percentile: float, cancelled: str | None = None) -> str:
    """'p99 ttft<=500ms, tpot<=50ms' (with ``cancelled``: how cancelled requests were counted, after a ';')."""
    text = f"p{percentile:g} " + ", ".join(str(s) for s in slos)
    if cancelled is not None:
        text += "; cancelled requests " + ("left out" if cancelled == "excluded" else "at their lower bound")
    return text
