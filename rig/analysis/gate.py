"""``rig compare A B --max-regression METRIC[_STAT]=PCT%``: a regression gate for CI that fails only on evidence.

For each pair of points ``rig compare`` pairs (same workload, load level, repeat; same steps where A has one) and
each threshold, the candidate's regression on the statistic is taken over the requests both points served ok
(paired on request_id): for a time (ttft, tpot, e2e) stat(candidate) / stat(baseline) - 1, for a rate
(decode_tok_s) stat(baseline) / stat(candidate) - 1, so positive is worse either way. Its 95 % interval is a paired
bootstrap: every resample draws the same request ids on both sides (m-out-of-n beyond rig.analysis.resample's
BOOTSTRAP_DRAWS). The verdict:

- **fail** when the whole interval lies above the threshold: the regression is beyond it with 95 % confidence;
- **pass** otherwise: within the threshold with confidence (interval at or below it), or not shown to exceed it
  (interval holds it);
- **fail** too when there is nothing to judge (no request served ok by both): the gate cannot vouch for it.

The thresholds see only the requests both points served; what they cannot see (failed or missing requests, points
flagged invalid or incomplete, levels one side lacks) are checks of their own: rig.analysis.gate_inputs.

Statistics: ``mean``, ``p50``, ``p90``, ``p95``, ``p99`` (numpy's linear percentiles, as the report's) and ``gm``,
the geometric mean of the per-request ratios (what ``rig compare`` prints as the speedup). ``tpot=3%`` is the mean.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from rig.analysis import resample as rs
from rig.contracts import GateVerdict

TIMES = ("ttft", "tpot", "e2e")
RATES = ("decode_tok_s",)
FAILED = "failed"  # no statistic: the share of the baseline's served requests that failed on the candidate
STATS = ("mean", "p50", "p90", "p95", "p99", "gm")
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Threshold:
    """The candidate may be at most ``limit`` (a fraction) worse than the baseline on ``stat`` of ``metric``."""

    metric: str
    stat: str
    limit: float

    @property
    def name(self) -> str:
        return self.metric if self.metric == FAILED else f"{self.metric}_{self.stat}"


def parse_threshold(text: str) -> Threshold:
    """``tpot_p99=3%``, ``ttft=5%`` (mean), ``decode_tok_s_p50=2.5%``, ``failed=0.5%`` (the share of the requests the
    baseline served ok that may fail on the candidate: rig.analysis.gate_inputs); ValueError with the accepted
    forms."""
    m = re.fullmatch(r"\s*([a-z_0-9]+)\s*=\s*([0-9]*\.?[0-9]+)\s*%\s*", text)
    if not m:
        raise ValueError(f"bad --max-regression {text!r}: expected METRIC[_STAT]=PCT%, e.g. tpot_p99=3%")
    name, pct = m.group(1), float(m.group(2))
    if name == FAILED:
        return Threshold(FAILED, "share", pct / 100.0)
    metric, stat = name, "mean"
    for s in STATS:
        if name.endswith("_" + s) and name[: -len(s) - 1] in TIMES + RATES:
            metric, stat = name[: -len(s) - 1], s
    if metric not in TIMES + RATES:
        raise ValueError(
            f"bad --max-regression {text!r}: metric must be one of {', '.join(TIMES + RATES)}, "
            f"optionally with _{'/_'.join(STATS)}; or {FAILED}=PCT%"
        )
    return Threshold(metric, stat, pct / 100.0)


def _stat(stat: str, a: np.ndarray) -> np.ndarray:
    """The statistic along the last axis."""
    if stat == "mean":
        return np.asarray(a.mean(axis=-1))
    return np.asarray(np.percentile(a, float(stat[1:]), axis=-1))


def regression(t: Threshold, base: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """How much worse the candidate is (positive: worse), along the last axis of paired samples."""
    if t.stat == "gm":  # of the per-request ratios
        worse = cand / base if t.metric in TIMES else base / cand
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(np.exp(np.log(worse).mean(axis=-1)) - 1)
    return (
        _stat(t.stat, cand) / _stat(t.stat, base) if t.metric in TIMES else _stat(t.stat, base) / _stat(t.stat, cand)
    ) - 1


def judge(t: Threshold, base: np.ndarray, cand: np.ndarray, resamples: int, seed: int) -> GateVerdict:
    """The regression, its paired bootstrap interval and the verdict for one pair of points' paired values."""
    keep = np.isfinite(base) & np.isfinite(cand) & (base > 0) & (cand > 0)
    base, cand = base[keep], cand[keep]
    n = base.size
    out: dict[str, Any] = {
        "metric": t.name,
        "threshold": t.limit,
        "pairs": int(n),
        "regression": None,
        "ci_low": None,
        "ci_high": None,
    }
    if n == 0:
        return GateVerdict.make(
            **out, verdict="fail", why="no request served ok by both points: nothing to judge, so nothing vouched for"
        )
    observed = float(regression(t, base, cand))
    rng = np.random.default_rng(seed)
    k = rs.draws(n)
    stats = np.empty(resamples)
    step = max(1, rs.BATCH_CELLS // k)
    for i in range(0, resamples, step):
        b = min(step, resamples - i)
        idx = rng.integers(0, n, size=(b, k))  # the same requests on both sides: paired
        stats[i : i + b] = regression(t, base[idx], cand[idx])
    stats = rs.shrink(stats, observed, n, k)
    stats = stats[np.isfinite(stats)]
    alpha = (1 - CONFIDENCE) / 2
    lo, hi = (float(x) for x in np.quantile(stats, [alpha, 1 - alpha]))
    out.update(regression=observed, ci_low=lo, ci_high=hi, subsampled=k < n)
    ci = f"{observed:+.1%} (95% CI {lo:+.1%} … {hi:+.1%}, {n:,} paired requests)"
    if lo > t.limit:
        return GateVerdict.make(**out, verdict="fail", why=f"{ci}: worse than +{t.limit:.1%} with 95% confidence")
    if hi <= t.limit:
        return GateVerdict.make(**out, verdict="pass", why=f"{ci}: within +{t.limit:.1%} with 95% confidence")
    return GateVerdict.make(
        **out, verdict="pass", why=f"{ci}: the interval holds +{t.limit:.1%}, so it is not shown to be exceeded"
    )
