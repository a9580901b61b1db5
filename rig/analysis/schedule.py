"""The speculative schedule by load: which steps to run in each load band, where the answer changes, and what each
setting gives at the highest load it serves within the SLOs.

From the points of a sweep or a tune (valid points only; with SLOs, only those meeting them), per workload and load
mode:

- **Bands**: each measured level (concurrency, or rate for an open loop) opens a band that runs up to the next
  level. In each, the configuration with the best value of the objective (mean over repeats): ``throughput``
  (aggregate tok/s, higher is better), ``j_per_token`` or ``usd_per_mtok`` (lower is better). Its margin over the
  runner-up (> 0: the best is better: best/runner-up - 1 for throughput, 1 - best/runner-up for the costs) with a
  bootstrap 95 % interval: over repeats where both have two or more; else from their requests, as ``rig compare``
  rescales a point's aggregate tok/s (Little's law over resampled requests; J/token and $/Mtok scale with
  1/throughput at the point's measured power and GPU count), drawing the same request ids on both sides where the
  two points served the same requests (``paired requests``: a sweep's points do), else each side on its own.
  ``decided`` says whether the interval excludes 0.
- **Crossovers**: consecutive bands whose best configuration differs, e.g. steps 4 up to C=32, steps 3 from C=64;
  ``incomplete`` names the settings without a valid point at either level (a change that may only mean a setting
  was not measured there), and ``decided`` needs the new best's interval to exclude 0 and nothing missing.
- **At the SLO limit**: for each configuration, the highest level where it meets the SLOs (every valid level
  without SLOs) and its throughput, tok/s per GPU, mean power, J/token, tok/s per W and $/Mtok there.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from rig.analysis import compare as cmp
from rig.analysis.energy_compare import paired_multipliers
from rig.analysis.frontier import valid
from rig.analysis.rows import Crossover, LimitEntry, ScheduleBand, ScheduleGroup
from rig.analysis.runs import AnalysisInputError, Run
from rig.contracts import CampaignRow

OBJECTIVES: dict[str, tuple[str, bool]] = {  # name -> (campaign row key, higher is better)
    "throughput": ("aggregate_tok_s", True),
    "j_per_token": ("j_per_token", False),
    "usd_per_mtok": ("usd_per_mtok", False),
}
RESAMPLES = 500
LIMIT_KEYS = (
    "aggregate_tok_s",
    "tok_s_per_gpu",
    "mean_power_w",
    "j_per_token",
    "tok_s_per_w",
    "usd_per_mtok",
    "energy_source",
)


class ScheduleError(AnalysisInputError):
    """The objective cannot be computed for this run (one line)."""


def _margin(best: float, runner: float, higher: bool) -> float:
    return best / runner - 1 if higher else 1 - best / runner


def _samples(
    run: Run, rows: list[CampaignRow], key: str, higher: bool, rng: np.random.Generator, resamples: int
) -> np.ndarray:
    """Bootstrap samples of a configuration's mean objective value at one level (its points' requests)."""
    per_point = []
    for r in rows:
        side = cmp.Side(run, run.point(r.point), r.point)
        mult = cmp._rescale_samples(side, rng, resamples)  # throughput multipliers
        per_point.append(r[key] * (mult if higher else 1.0 / mult))
    return np.mean(per_point, axis=0)


def _pairs(
    run: Run, best: CampaignRow, runner: CampaignRow, rng: np.random.Generator, resamples: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """Paired throughput multipliers of two points (energy_compare.paired_multipliers), None when they share fewer than
    two requests."""
    sides = [cmp.Side(run, run.point(r.point), r.point) for r in (best, runner)]
    mb, mr, n = paired_multipliers(sides[0], sides[1], rng, resamples)
    return (mb, mr) if n >= 2 else None


def interval(
    run: Run,
    best: list[CampaignRow],
    runner: list[CampaignRow],
    key: str,
    higher: bool,
    rng: np.random.Generator,
    resamples: int,
) -> tuple[float | None, float | None, str | None]:
    """Bootstrap 95 % interval of ``best`` over ``runner`` (best/runner - 1 when higher is better, else
    1 - best/runner), and how it was drawn: over repeats, paired requests, or each side's requests."""
    if len(best) > 1 and len(runner) > 1:
        bv, rv = np.array([r[key] for r in best]), np.array([r[key] for r in runner])
        bs = bv[rng.integers(0, bv.size, (resamples, bv.size))].mean(1)
        rs = rv[rng.integers(0, rv.size, (resamples, rv.size))].mean(1)
        method = "repeats"
    elif len(best) == 1 and len(runner) == 1 and (paired := _pairs(run, best[0], runner[0], rng, resamples)):
        # One point each with the same requests (a sweep's points pair up): resample the pairs, so the request mix
        # cancels and what is left is the settings' difference.
        mb, mr = paired
        b, r = best[0][key], runner[0][key]
        bs, rs = (b * mb, r * mr) if higher else (b / mb, r / mr)
        method = "paired requests"
    else:
        bs = _samples(run, best, key, higher, rng, resamples)
        rs = _samples(run, runner, key, higher, rng, resamples)
        method = "requests"
    with np.errstate(divide="ignore", invalid="ignore"):
        m = bs / rs - 1 if higher else 1 - bs / rs
    m = m[np.isfinite(m)]
    if not m.size:
        return None, None, None
    lo, hi = np.quantile(m, [(1 - cmp.CONFIDENCE) / 2, 1 - (1 - cmp.CONFIDENCE) / 2])
    return float(lo), float(hi), method


def check_objective(rows: list[CampaignRow], objective: str, why_absent: str | None = None) -> None:
    """ScheduleError (one line) when no point has the objective's figure."""
    if objective not in OBJECTIVES:
        raise ScheduleError(f"unknown objective {objective!r} (choose {', '.join(OBJECTIVES)})")
    key = OBJECTIVES[objective][0]
    if any(r.get(key) is not None for r in rows):
        return
    if objective == "j_per_token":
        raise ScheduleError(
            "--objective j_per_token needs GPU telemetry, and this run has no energy figures"
            + (f" ({why_absent})" if why_absent else "")
        )
    if objective == "usd_per_mtok":
        raise ScheduleError(
            "--objective usd_per_mtok needs a GPU-hour price: --gpu-hour-price USD, or "
            "gpu_hour_price in the cluster file"
        )


# Configurations of one (workload, load mode), by level: level -> configuration label -> its campaign rows
Levels = dict[float, dict[str, list[CampaignRow]]]


@dataclass
class _Groups:
    """The valid points of a run grouped by (workload, load mode) and level, with each configuration's steps."""

    levels: dict[tuple[str, str], Levels]
    steps_of: dict[str, Any]


def _group_points(run: Run, rows: list[CampaignRow]) -> _Groups:
    """Valid points with a level, grouped by (workload, load mode), level and configuration label."""
    groups: dict[tuple[str, str], Levels] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    steps_of: dict[str, Any] = {}
    for r in rows:
        level = r.level
        if not valid(r) or level is None:
            continue
        label = cmp.config_label(cmp.Side(run, run.point(r.point), r.point))
        steps_of[label] = r.steps
        groups[(str(r.workload), str(r.load_mode))][level][label].append(r)
    return _Groups(groups, steps_of)


@dataclass
class _Ranking:
    """What one schedule ranks by, and how its intervals are drawn."""

    run: Run
    meets: dict[str, bool] | None
    key: str
    higher: bool
    steps_of: dict[str, Any]
    rng: np.random.Generator
    resamples: int

    def passes(self, r: CampaignRow) -> bool:
        """The point meets the SLOs (every point does without SLOs)."""
        return self.meets is None or bool(self.meets.get(r.point))

    def mean(self, rows: list[CampaignRow]) -> float:
        return float(np.mean([r[self.key] for r in rows]))


def _empty_band(level: float, up_to: float | None, candidates: int, missing: list[str]) -> ScheduleBand:
    """A band before it is ranked: its range, how many settings compete and which have no valid point."""
    return ScheduleBand(
        level=level,
        up_to=up_to,
        best=None,
        best_steps=None,
        value=None,
        runner_up=None,
        runner_up_value=None,
        margin=None,
        ci_low=None,
        ci_high=None,
        ci_method=None,
        decided=None,
        candidates=candidates,
        missing=missing,
    )


def _band(
    rk: _Ranking, by_label: dict[str, list[CampaignRow]], configs: list[str], level: float, up_to: float | None
) -> ScheduleBand:
    """One band: the best configuration at this level, its runner-up and the interval of the margin."""
    ok = {lab: [r for r in rs if rk.passes(r) and r.get(rk.key) is not None] for lab, rs in by_label.items()}
    ok = {lab: rs for lab, rs in ok.items() if rs}
    band = _empty_band(level, up_to, len(ok), [lab for lab in configs if not by_label.get(lab)])
    if not ok:
        return band
    ranked = sorted(ok.items(), key=lambda kv: -rk.mean(kv[1]) if rk.higher else rk.mean(kv[1]))
    b_lab, b_rows = ranked[0]
    b_val = rk.mean(b_rows)
    band["best"], band["best_steps"], band["value"] = b_lab, rk.steps_of[b_lab], b_val
    if len(ranked) > 1:
        r_lab, r_rows = ranked[1]
        r_val = rk.mean(r_rows)
        lo, hi, method = interval(rk.run, b_rows, r_rows, rk.key, rk.higher, rk.rng, rk.resamples)
        band["runner_up"], band["runner_up_value"] = r_lab, r_val
        band["margin"] = _margin(b_val, r_val, rk.higher)
        band["ci_low"], band["ci_high"], band["ci_method"] = lo, hi, method
        band["decided"] = bool(lo is not None and lo > 0)
    return band


def _crossovers(bands: list[ScheduleBand]) -> list[Crossover]:
    """Consecutive answered bands whose best configuration differs."""
    out: list[Crossover] = []
    answered = [b for b in bands if b["best"] is not None]
    for prev, band in zip(answered, answered[1:], strict=False):
        if band["best"] == prev["best"]:
            continue
        missing = sorted(set(prev["missing"]) | set(band["missing"]))
        out.append(
            {
                "from_level": prev["level"],
                "to_level": band["level"],
                "from": str(prev["best"]),  # answered bands: never None
                "to": str(band["best"]),
                "from_steps": prev["best_steps"],
                "to_steps": band["best_steps"],
                "incomplete": missing or None,
                "decided": bool(band["decided"]) and not missing,
            }
        )
    return out


def _figure(rows: list[CampaignRow], key: str) -> Any:
    """The mean of a figure over the rows that have it (the first value for a text, None when none has it)."""
    vals: list[Any] = [r.get(key) for r in rows if r.get(key) is not None]
    if not vals:
        return None
    return vals[0] if key == "energy_source" else float(np.mean(vals))


def _at_slo_limit(rk: _Ranking, levels: Levels, configs: list[str]) -> list[LimitEntry]:
    """Each configuration at the highest level where it meets the SLOs, with its figures there."""
    out = []
    for lab in configs:
        passing = [(level, r) for level in sorted(levels) for r in levels[level].get(lab, []) if rk.passes(r)]
        top_level = max((lv for lv, _ in passing), default=None)
        at = [r for lv, r in passing if lv == top_level]
        out.append(
            LimitEntry(
                config=lab,
                steps=rk.steps_of[lab],
                max_level=top_level,
                points=[r.point for r in at],
                aggregate_tok_s=_figure(at, "aggregate_tok_s"),
                tok_s_per_gpu=_figure(at, "tok_s_per_gpu"),
                mean_power_w=_figure(at, "mean_power_w"),
                j_per_token=_figure(at, "j_per_token"),
                tok_s_per_w=_figure(at, "tok_s_per_w"),
                usd_per_mtok=_figure(at, "usd_per_mtok"),
                energy_source=_figure(at, "energy_source"),
            )
        )
    return out


def build_schedule(
    run: Run,
    rows: list[CampaignRow],
    meets: dict[str, bool] | None,
    objective: str = "throughput",
    resamples: int = RESAMPLES,
    seed: int = cmp.SEED,
) -> list[ScheduleGroup]:
    """One entry per (workload, load mode) with two or more configurations: bands, crossovers, SLO limits."""
    key, higher = OBJECTIVES[objective]
    groups = _group_points(run, rows)
    rk = _Ranking(run, meets, key, higher, groups.steps_of, np.random.default_rng(seed), resamples)
    out = []
    for (workload, mode), levels in sorted(groups.levels.items()):
        configs = sorted({lab for by in levels.values() for lab in by}, key=lambda c: (str(rk.steps_of[c]), c))
        if len(configs) < 2:
            continue
        order = sorted(levels)
        ups: list[float | None] = [*order[1:], None]
        bands = [_band(rk, levels[level], configs, level, up) for level, up in zip(order, ups, strict=True)]
        out.append(
            ScheduleGroup(
                workload=workload,
                load_mode=mode,
                objective=objective,
                key=key,
                higher_is_better=higher,
                bands=bands,
                crossovers=_crossovers(bands),
                at_slo_limit=_at_slo_limit(rk, levels, configs),
            )
        )
    return out


def schedule_rows(schedule: list[ScheduleGroup]) -> list[dict[str, Any]]:
    """The bands of every group as flat rows (CSV)."""
    return [
        {"workload": s["workload"], "load_mode": s["load_mode"], "objective": s["objective"], **b}
        for s in schedule
        for b in s["bands"]
    ]


def limit_rows(schedule: list[ScheduleGroup]) -> list[dict[str, Any]]:
    """The at-the-SLO-limit entries of every group as flat rows (CSV)."""
    return [
        {
            "workload": s["workload"],
            "load_mode": s["load_mode"],
            **{k: v for k, v in e.items() if k != "points"},
            "points": e["points"],
        }
        for s in schedule
        for e in s["at_slo_limit"]
    ]
