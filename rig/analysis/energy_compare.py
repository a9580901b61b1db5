"""Energy and cost in ``rig compare``: J/token and $/Mtok of a candidate point over its baseline, with paired bootstrap
intervals (the same request ids resampled on both sides); the paired throughput multipliers are shared with the
speculative schedule (rig.analysis.schedule)."""

from __future__ import annotations

import numpy as np

from rig.analysis import metrics as m
from rig.analysis import resample as rs
from rig.analysis.pairing import (
    _BATCH_CELLS,
    CONFIDENCE,
    RESAMPLES,
    SEED,
    Side,
    _inputs_note,
    incomplete,
    note_subsample,
    pair_identity,
    paired_table,
)
from rig.analysis.points import campaign_row, load_requests
from rig.analysis.rows import EnergyRatioRow
from rig.contracts import CampaignRow

ENERGY_METRICS = ("j_per_token", "usd_per_mtok")


def _throughput_multipliers(tok: np.ndarray, lat: np.ndarray, idx: np.ndarray, closed: bool) -> np.ndarray:
    """Resampled / observed aggregate throughput of a point from resampled requests (rows of ``idx``, each of k draws
    from n): Little's law in a closed loop (Σtokens/Σlatency), Σtokens in an open one (the arrival rate is fixed;
    k draws sum k/n of what n do)."""
    if closed:
        return (tok[idx].sum(axis=1) / lat[idx].sum(axis=1)) / (tok.sum() / lat.sum())
    k = idx.shape[1]
    return tok[idx].sum(axis=1) / (tok.sum() * (k / tok.size if k < tok.size else 1))


def _energy_row(side: Side, price: float | None) -> CampaignRow:
    from rig.analysis.energy import add_energy

    row = campaign_row(side.run, side.point, load_requests(side.run, side.point))
    add_energy(side.run, [row], price)
    return row


def paired_multipliers(
    base: Side, cand: Side, rng: np.random.Generator, resamples: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Bootstrap multipliers of both points' aggregate tok/s from resampling the requests they share (the same
    request ids drawn on both sides, so the request mix cancels in their ratio), and how many pairs there are."""
    j, _ = paired_table(base, cand)  # the points' ok requests, read once for the speedups and the intervals
    cols = {
        k: m.as_float(j[k]) if j.num_rows else np.empty(0)
        for k in ("tokens_base", "e2e_base", "tokens_cand", "e2e_cand")
    }
    keep = np.logical_and.reduce([np.isfinite(v) for v in cols.values()]) if j.num_rows else np.zeros(0, bool)
    n = int(keep.sum())
    mb, mc = np.full(resamples, np.nan), np.full(resamples, np.nan)
    if n == 0:
        return mb, mc, 0
    tb, lb, tc, lc = (cols[k][keep] for k in ("tokens_base", "e2e_base", "tokens_cand", "e2e_cand"))
    k = rs.draws(n)  # m-out-of-n beyond BOOTSTRAP_DRAWS pairs (rig.analysis.resample)
    for side in (base, cand):
        note_subsample(side.run, n)
    step = max(1, _BATCH_CELLS // k)
    for i in range(0, resamples, step):
        b = min(step, resamples - i)
        idx = rng.integers(0, n, size=(b, k))
        mb[i : i + b] = _throughput_multipliers(tb, lb, idx, not base.point.open_loop)
        mc[i : i + b] = _throughput_multipliers(tc, lc, idx, not cand.point.open_loop)
    mb, mc = rs.shrink(mb, 1.0, n, k), rs.shrink(mc, 1.0, n, k)
    return mb, mc, n


def energy_ratios(
    base: Side, cand: Side, price: float | None = None, resamples: int = RESAMPLES, seed: int = SEED
) -> list[EnergyRatioRow]:
    """J/token and $/Mtok of the candidate over the baseline (< 1: the candidate spends less per token), each with a
    paired bootstrap interval: the same request ids are resampled on both sides and each side's value moves with
    1 / its resampled throughput (its energy over the window and its GPUs fixed, as measured). Empty when neither
    figure exists on both sides."""
    rb, rc = _energy_row(base, price), _energy_row(cand, price)
    metrics = [k for k in ENERGY_METRICS if rb.get(k) is not None and rc.get(k) is not None]
    if not metrics:
        return []
    why_a, why_b = incomplete(base), incomplete(cand)
    mb, mc, n = paired_multipliers(base, cand, np.random.default_rng(seed), resamples)
    source = ",".join(sorted({str(x) for x in (rb.energy_source, rc.energy_source) if x})) or None
    rows = []
    for metric in metrics:
        vb, vc = float(rb[metric]), float(rc[metric])
        row: EnergyRatioRow = {
            **pair_identity(base, cand),
            "metric": metric,
            "baseline_value": vb,
            "candidate_value": vc,
            "ratio": vc / vb if vb else None,
            "ci_low": None,
            "ci_high": None,
            "pairs": n,
            "source": source if metric == "j_per_token" else None,
            "incomplete": _inputs_note((base, why_a), (cand, why_b)),
        }
        if n and vb:
            ratios = (vc / mc) / (vb / mb)
            ratios = ratios[np.isfinite(ratios)]
            if ratios.size:
                lo, hi = np.quantile(ratios, [(1 - CONFIDENCE) / 2, 1 - (1 - CONFIDENCE) / 2])
                row["ci_low"], row["ci_high"] = float(lo), float(hi)
        rows.append(row)
    return rows
