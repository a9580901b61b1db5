"""Paired comparisons: per-request speedups of a candidate over a baseline, and the best steps per load level.

Speedups join the two points' ok requests on ``request_id`` (the same seeded request at the same workload and load
level), take the per-request ratio (baseline/candidate for times, candidate/baseline for rates; > 1 means the
candidate is faster) and report their geometric mean with a bootstrap 95 % percentile interval over the pairs.

The best configuration of a level is the one with the highest aggregate tok/s (mean over repeats). Its margin over
the runner-up is best/runner-up − 1. The interval resamples repeats when both have two or more; otherwise it
resamples each point's requests and scales the point's aggregate by the resampled/observed ratio of Σtokens/Σlatency
(closed loop: throughput = concurrency × Σtokens/ΣE2E by Little's law) or of Σtokens (open loop: the arrival rate is
fixed), which captures request-to-request variability but not run-to-run drift.

Every bootstrap costs what it needs, not what the run holds (rig.analysis.resample: up to 5,000 items the full
bootstrap, draw for draw; beyond, an m-out-of-n bootstrap, and the run's warnings say so).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from rig.analysis import gate_inputs as gi
from rig.analysis import metrics as m
from rig.analysis import resample as rs
from rig.analysis.gate import FAILED, Threshold, judge
from rig.analysis.pairing import (
    _BATCH_CELLS,
    CONFIDENCE,
    RESAMPLES,
    SEED,
    Side,
    _inputs_note,
    note_subsample,
    pair_identity,
    paired_table,
)
from rig.analysis.points import INCOMPLETE, campaign_row, load_requests
from rig.analysis.rows import CompareResult, EnergyRatioRow, GateRow, LevelBest, SpeedupRow
from rig.analysis.runs import (
    AnalysisInputError,
    PointInfo,
    Run,
    load_run,
    sampled_workloads,
)
from rig.contracts import CampaignRow

SPEEDUP_METRICS = ("e2e", "ttft", "tpot", "decode_tok_s")


def bootstrap_mean_ci(x: np.ndarray, resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``x`` (seeded, vectorised in batches; m-out-of-n beyond
    BOOTSTRAP_DRAWS items)."""
    rng = np.random.default_rng(seed)
    n = x.size
    k = rs.draws(n)
    means = np.empty(resamples)
    step = max(1, _BATCH_CELLS // max(k, 1))
    for i in range(0, resamples, step):
        b = min(step, resamples - i)
        means[i : i + b] = x[rng.integers(0, n, size=(b, k))].mean(axis=1)
    means = rs.shrink(means, float(x.mean()), n, k)
    alpha = (1 - CONFIDENCE) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(lo), float(hi)


def gate_rows(
    base: Side, cand: Side, thresholds: list[Threshold], resamples: int = RESAMPLES, seed: int = SEED
) -> list[GateRow]:
    """One verdict per threshold for one pair of points (rig.analysis.gate)."""
    j, note = paired_table(base, cand)
    rows = []
    for t in thresholds:
        x = m.as_float(j[f"{t.metric}_base"]) if j.num_rows else np.empty(0)
        y = m.as_float(j[f"{t.metric}_cand"]) if j.num_rows else np.empty(0)
        got = judge(t, x, y, resamples, seed)
        if got.subsampled:
            for side in (base, cand):
                note_subsample(side.run, got.pairs)
        rows.append(
            GateRow(
                baseline=base.label,
                candidate=cand.label,
                metric=got.metric,
                threshold=got.threshold,
                pairs=got.pairs,
                regression=got.regression,
                ci_low=got.ci_low,
                ci_high=got.ci_high,
                verdict=got.verdict,
                why=got.why,
                incomplete=note,
            )
        )
    return rows


def paired_speedups(
    base: Side, cand: Side, resamples: int = RESAMPLES, seed: int = SEED, metrics: tuple[str, ...] = SPEEDUP_METRICS
) -> list[SpeedupRow]:
    """One row per metric: pairs, geometric-mean speedup, its bootstrap CI, and the median per-request ratio."""
    j, note = paired_table(base, cand)
    rows = []
    for metric in metrics:
        x = m.as_float(j[f"{metric}_base"]) if j.num_rows else np.empty(0)
        y = m.as_float(j[f"{metric}_cand"]) if j.num_rows else np.empty(0)
        with np.errstate(divide="ignore", invalid="ignore"):  # a zero either side is no pair (dropped below)
            ratio = (y / x) if metric == "decode_tok_s" else (x / y)  # > 1: the candidate is better
            logs = np.log(ratio)
        logs = logs[np.isfinite(logs)]
        row: SpeedupRow = {
            **pair_identity(base, cand),
            "metric": metric,
            "pairs": int(logs.size),
            "speedup": None,
            "ci_low": None,
            "ci_high": None,
            "median_ratio": None,
            "incomplete": note,
        }
        if logs.size:
            for side in (base, cand):
                note_subsample(side.run, logs.size)
            lo, hi = bootstrap_mean_ci(logs, resamples, seed)
            row["speedup"] = float(np.exp(logs.mean()))
            row["ci_low"], row["ci_high"] = float(np.exp(lo)), float(np.exp(hi))
            row["median_ratio"] = float(np.exp(np.median(logs)))
        rows.append(row)
    return rows


def unseeded_pairs(pairs: list[tuple[Side, Side]]) -> list[str]:
    """Pairs on a sampled workload where either side's server ignored per-request seeds ('base vs cand')."""
    out = []
    for base, cand in pairs:
        sampled = cand.point.workload in sampled_workloads(cand.run.manifest)
        if sampled and (base.point.seeds_honoured is False or cand.point.seeds_honoured is False):
            out.append(f"{base.label} vs {cand.label}")
    return out


# --- pairing points -----------------------------------------------------------------------------------------------


def pair_runs(a: Run, b: Run, label_a: str, label_b: str) -> list[tuple[Side, Side]]:
    """Each point of B with A's point at the same workload and level: same steps if A has one, else A's only one."""
    by_level: dict[tuple, list[PointInfo]] = defaultdict(list)
    for p in a.points:
        by_level[p.level_key()].append(p)
    pairs = []
    for pb in b.points:
        cands = by_level.get(pb.level_key(), [])
        same = [pa_ for pa_ in cands if pa_.steps == pb.steps]
        match = same[0] if same else (cands[0] if len(cands) == 1 else None)
        if match is not None:
            pairs.append((Side(a, match, f"{label_a}:{match.point}"), Side(b, pb, f"{label_b}:{pb.point}")))
    return pairs


def pair_within(run: Run, baseline_steps: int) -> list[tuple[Side, Side]]:
    """Every point whose steps differ from ``baseline_steps`` with the baseline point of the same workload and level
    (and the same non-speculative server knobs when there is one)."""
    pairs = []
    for p in run.points:
        if p.steps == baseline_steps:
            continue
        base = [q for q in run.points if q.steps == baseline_steps and q.level_key() == p.level_key()]
        pref = [q for q in base if q.non_speculative_knobs() == p.non_speculative_knobs()] or base
        if pref:
            pairs.append((Side(run, pref[0], pref[0].point), Side(run, p, p.point)))
    return pairs


# --- best steps per level ----------------------------------------------------------------------------------------


def _rescale_samples(side: Side, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """Bootstrap multipliers of a point's aggregate tok/s from resampling its ok requests."""
    r = load_requests(side.run, side.point)
    ok = r.ok & np.isfinite(r.tokens) & np.isfinite(r.e2e)
    tok, lat = r.tokens[ok], r.e2e[ok]
    if tok.size == 0 or tok.sum() <= 0:
        return np.full(resamples, np.nan)
    closed = not side.point.open_loop
    k = rs.draws(tok.size)
    note_subsample(side.run, tok.size)
    # m draws sum m/n of what n do: the open loop's statistic (Σtokens) is compared per draw
    observed = tok.sum() / lat.sum() if closed else tok.sum() * (k / tok.size if k < tok.size else 1)
    out = np.empty(resamples)
    step = max(1, _BATCH_CELLS // k)
    for i in range(0, resamples, step):
        n = min(step, resamples - i)
        idx = rng.integers(0, tok.size, size=(n, k))
        s = tok[idx].sum(axis=1)
        out[i : i + n] = (s / lat[idx].sum(axis=1) if closed else s) / observed
    return rs.shrink(out, 1.0, tok.size, k)


def config_label(s: Side) -> str:
    """'steps=N', or 'adaptive(start steps=N)' for an adaptive server (prefixed by the run when comparing two;
    where two configurations share N, with the knob values that tell them apart, else the config id)."""
    from rig.analysis.settings import grid_knobs, setting_name

    p = s.point
    shared = len({q.server_config for q in s.run.points if q.steps == p.steps}) > 1
    knobs = grid_knobs(s.run).get(p.server_config or "") if shared else None
    # An adaptive server switches steps itself: its steps are where it starts, not a fixed setting.
    adaptive = s.run.server_config(p.server_config).adaptive is not None
    name = setting_name(p.steps, p.server_config, knobs, shared, adaptive=adaptive)
    return name if s.label == p.point else s.label.rsplit(":", 1)[0] + ":" + name


def best_per_level(
    sides: list[Side], resamples: int = RESAMPLES, seed: int = SEED, rows: dict[str, CampaignRow] | None = None
) -> list[LevelBest]:
    """Per (workload, load level): the configuration with the highest aggregate tok/s and its margin (with CI).

    ``rows``: the campaign rows of the sides' points by point name, when the caller has them (one run's report)."""
    rng = np.random.default_rng(seed)
    levels: dict[tuple, dict[str, list[tuple[Side, float]]]] = defaultdict(lambda: defaultdict(list))
    why: dict[int, list[str]] = {}
    at_level: dict[tuple, list[Side]] = defaultdict(list)
    for s in sides:
        point_row = rows.get(s.point.point) if rows is not None else None
        if point_row is None:
            r = load_requests(s.run, s.point)
            point_row = campaign_row(s.run, s.point, r)
        why[id(s)] = sorted(set(point_row.flags) & INCOMPLETE)  # incomplete(s, r): the row's flags are its flags
        p = s.point
        at_level[(p.workload, p.load_mode, p.concurrency, p.rate)].append(s)  # with or without rows
        if point_row.aggregate_tok_s is None:
            continue
        levels[(p.workload, p.load_mode, p.concurrency, p.rate)][config_label(s)].append((s, point_row.aggregate_tok_s))
    out = []
    for (workload, mode, conc, rate), configs in levels.items():
        ranked = sorted(configs.items(), key=lambda kv: -np.mean([v for _, v in kv[1]]))
        best_cfg, best = ranked[0]
        row: LevelBest = {
            "workload": workload,
            "load_mode": mode,
            "concurrency": conc,
            "rate": rate,
            "best": best_cfg,
            "best_aggregate_tok_s": float(np.mean([v for _, v in best])),
            "runner_up": None,
            "runner_up_aggregate_tok_s": None,
            "margin": None,
            "ci_low": None,
            "ci_high": None,
            "ci_method": None,
            # every configuration at this level takes part in the ranking, one without rows too
            "incomplete": _inputs_note(*((x, why[id(x)]) for x in at_level[(workload, mode, conc, rate)])),
        }
        if len(ranked) > 1:
            run_cfg, runner = ranked[1]
            b_mean, r_mean = row["best_aggregate_tok_s"], float(np.mean([v for _, v in runner]))
            row["runner_up"], row["runner_up_aggregate_tok_s"] = run_cfg, r_mean
            if r_mean <= 0:  # every request of the runner-up failed: a margin over nothing is not a finding
                row["incomplete"] = "; ".join(x for x in (row["incomplete"], f"{run_cfg} has 0 tok/s: no margin") if x)
                out.append(row)
                continue
            row["margin"] = b_mean / r_mean - 1
            if len(best) > 1 and len(runner) > 1:
                bv, rv = np.array([v for _, v in best]), np.array([v for _, v in runner])
                bs = bv[rng.integers(0, bv.size, (resamples, bv.size))].mean(1)
                rs = rv[rng.integers(0, rv.size, (resamples, rv.size))].mean(1)
                method = "repeats"
            else:
                bs = b_mean * np.mean([_rescale_samples(s, rng, resamples) for s, _ in best], axis=0)
                rs = r_mean * np.mean([_rescale_samples(s, rng, resamples) for s, _ in runner], axis=0)
                method = "requests"
            with np.errstate(divide="ignore", invalid="ignore"):
                margins = bs / rs - 1
            margins = margins[np.isfinite(margins)]
            if margins.size:
                alpha = (1 - CONFIDENCE) / 2
                lo, hi = np.quantile(margins, [alpha, 1 - alpha])
                row["ci_low"], row["ci_high"], row["ci_method"] = float(lo), float(hi), method
        out.append(row)
    key = lambda r: (str(r["workload"]), str(r["load_mode"]), r["concurrency"] or 0, r["rate"] or 0)  # noqa: E731
    return sorted(out, key=key)


# --- entry points ------------------------------------------------------------------------------------------------


def parse_target(text: str) -> tuple[Path, str | None]:
    """'RUN_DIR' or 'RUN_DIR:POINT' (a directory whose name holds ':' wins over the split)."""
    if Path(text).is_dir() or ":" not in text:
        return Path(text), None
    run_dir, point = text.rsplit(":", 1)
    return Path(run_dir), point


def _pairing(a: str, b: str | None, baseline_steps: int | None) -> tuple[list[tuple[Side, Side]], list[Side], str]:
    """The pairs of points compare() compares, every side it ranks, and the comparison's mode line."""
    da, pa_ = parse_target(a)
    if b is None:
        if baseline_steps is None:
            raise AnalysisInputError("compare needs two runs or points, or one run with --baseline-steps")
        run = load_run(da)
        pairs = pair_within(run, baseline_steps)
        sides = [Side(run, p, p.point) for p in run.points]
        mode = f"within {run.run_id}, baseline steps={baseline_steps}"
    else:
        if baseline_steps is not None:
            raise AnalysisInputError("--baseline-steps compares the points of one run; give one run, not two")
        db, pb = parse_target(b)
        ra, rb = load_run(da), (load_run(db) if db != da else None)
        rb = rb or ra
        if (pa_ is None) != (pb is None):
            raise AnalysisInputError("give two runs (A B) or two points (RUN:POINT RUN:POINT), not one of each")
        la, lb = (ra.run_id, rb.run_id) if ra.run_id != rb.run_id else ("A", "B")
        if pa_ is not None and pb is not None:  # both or neither (checked above)
            # Two points of one run need no run prefix.
            na, nb = (pa_, pb) if ra is rb else (f"{la}:{pa_}", f"{lb}:{pb}")
            sa, sb = Side(ra, ra.point(pa_), na), Side(rb, rb.point(pb), nb)
            pairs, sides = [(sa, sb)], [sa, sb]
            mode = f"{sa.label} vs {sb.label}"
        else:
            pairs = pair_runs(ra, rb, la, lb)
            sides = [Side(ra, p, f"{la}:{p.point}") for p in ra.points] + [
                Side(rb, p, f"{lb}:{p.point}") for p in rb.points
            ]
            mode = f"{la} (baseline) vs {lb}"
    if not pairs and b is None:
        have = sorted({p.steps for p in run.points if p.steps is not None})
        if baseline_steps not in have:
            raise AnalysisInputError(
                f"no point of {run.run_id} has steps={baseline_steps} (its steps: "
                f"{', '.join(map(str, have)) or 'none'}); pick one of those for --baseline-steps"
            )
    return pairs, sides, mode


def _coverage_rows(pairs: list[tuple[Side, Side]], sides: list[Side], a: str, b: str | None) -> list[GateRow]:
    """The gate's coverage checks: within one run its configurations x levels, between two runs each point's
    counterpart (two points named: none)."""
    if b is None:
        return gi.grid_rows(sides)
    if parse_target(a)[1] is not None:
        return []
    return gi.unpaired_rows(pairs, sides, pairs[0][0].run)


def compare(
    a: str,
    b: str | None = None,
    baseline_steps: int | None = None,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    gpu_hour_price: float | None = None,
    max_regression: list[Threshold] | None = None,
    allow_incomplete: bool = False,
) -> CompareResult:
    """Run the comparison the arguments describe; see the module docstring. ``max_regression``: the CI gate's
    thresholds (rig.analysis.gate) and the checks of what they cannot see (rig.analysis.gate_inputs; waived with
    ``allow_incomplete``); its verdicts are the result's ``gate``."""
    pairs, sides, mode = _pairing(a, b, baseline_steps)
    if not pairs:
        raise AnalysisInputError("no matching points to compare (same workload, load level and repeat)")
    speedups: list[SpeedupRow] = []
    gate: list[GateRow] = []
    for base, cand in pairs:
        speedups += paired_speedups(base, cand, resamples, seed)
        if max_regression:
            tolerance = max((t.limit for t in max_regression if t.metric == FAILED), default=0.0)
            gate.append(gi.served_row(base, cand, tolerance))
            gate += [row for row in [gi.inputs_row(base, cand)] if row is not None]
            stats = [t for t in max_regression if t.metric != FAILED]
            gate += gate_rows(base, cand, stats, resamples, seed)
    if max_regression:
        gate = gi.waive(gate + _coverage_rows(pairs, sides, a, b), allow_incomplete)
    best = best_per_level(sides, resamples, seed)
    warnings: list[str] = []
    runs = list({id(s.run): s.run for s in sides}.values())  # each run once, in order
    for run in runs:
        warnings += [f"{run.run_id}: {w}" for w in run.warnings]
    unseeded = unseeded_pairs(pairs)
    if unseeded:
        warnings.append(
            f"{len(unseeded)} pair(s) of points compare sampled requests whose seeds the server did not "
            f"honour ({', '.join(unseeded[:3])}{' …' if len(unseeded) > 3 else ''}): the paired "
            "requests drew different outputs, so per-request ratios mix configuration and chance; rerun "
            "with --deterministic (SGLang --enable-deterministic-inference)"
        )
    from rig.analysis.energy_compare import energy_ratios

    energy: list[EnergyRatioRow] = [
        row for base, cand in pairs for row in energy_ratios(base, cand, gpu_hour_price, resamples, seed)
    ]
    affected = sum(1 for r in [*speedups, *best, *energy] if r["incomplete"])
    if affected:
        warnings.append(f"{affected} figure(s) rest on incomplete inputs (marked '!' below): treat them with care")
    if any("simulated" in (r["source"] or "") for r in energy):
        warnings.append("energy figures are SIMULATED (the simulator's power model, not a measurement)")
    out: CompareResult = {
        "mode": mode,
        "resamples": resamples,
        "seed": seed,
        "speedups": speedups,
        "best": best,
        "warnings": warnings,
    }
    if energy:  # only where a side has GPU telemetry or a price: other comparisons read as before
        out["energy"] = energy
    if max_regression:
        out["gate"] = gate
    return out
