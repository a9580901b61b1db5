"""Across all points of a run: the Pareto frontier of per-user speed against per-GPU throughput, and the best
configuration per load level and per SLO, each with its margin over the runner-up.

- **Frontier** (per workload, valid points only): x = aggregate tok/s per GPU (aggregate tok/s / tp), y = decode
  tok/s per request (the speed a user sees once tokens flow). A point is on the frontier when no other point is at
  least as good on both and better on one (vLLM's ``plot_pareto`` axes).
- **Best per load level**: among the valid points of a level that meet the SLOs (every point when none are given),
  the configuration with the highest aggregate tok/s, with its margin over the runner-up and the bootstrap interval
  ``rig compare`` computes (``compare.best_per_level``), plus the paired per-request decode-speed ratio of the two
  (``compare.paired_speedups``: same request ids at the same level).
- **Best per SLO**: the configuration that meets the SLOs at the highest load level (its capacity under the SLO);
  ties go to the higher aggregate tok/s at that level. Its margin over the runner-up is the capacity ratio, and, when
  the runner-up also meets the SLOs at that level, the throughput margin there with its interval.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, TypedDict

from rig.analysis import compare as cmp
from rig.analysis.points import INVALIDATING
from rig.analysis.rows import FrontierRow, ReportLevelBest
from rig.analysis.runs import Run
from rig.contracts import CampaignRow

RESAMPLES = 500  # a report computes an interval per level; compare's default (2,000) is for one comparison


def per_gpu(tp_by_point: dict[str, Any], row: CampaignRow) -> float | None:
    """Aggregate tok/s divided by the configuration's GPUs (tp; 1 when unknown)."""
    agg = row.aggregate_tok_s
    return agg / float(tp_by_point.get(row.point) or 1) if agg is not None else None


def valid(row: CampaignRow) -> bool:
    return row.aggregate_tok_s is not None and not (set(row.flags) & INVALIDATING)


def mark_frontier(run: Run, rows: list[CampaignRow]) -> None:
    """Set ``tok_s_per_gpu`` and ``on_frontier`` on every campaign row (in place)."""
    by_workload: dict[Any, list[tuple[CampaignRow, float, float]]] = defaultdict(list)
    tp = {p.point: p.knobs.get("tp") for p in run.points}
    for r in rows:
        r.tok_s_per_gpu = per_gpu(tp, r)
        r.on_frontier = False
        if valid(r) and r.tok_s_per_gpu is not None and r.decode_tok_s is not None:
            by_workload[r.workload].append((r, r.tok_s_per_gpu, r.decode_tok_s))
    for pts in by_workload.values():
        for r, x, y in pts:
            r.on_frontier = not any((ox >= x and oy >= y) and (ox > x or oy > y) for o, ox, oy in pts if o is not r)


def frontier_rows(rows: list[CampaignRow]) -> list[FrontierRow]:
    """The frontier's points per workload, by per-GPU throughput."""
    front = [
        FrontierRow(
            workload=r.workload,
            point=r.point,
            steps=r.steps,
            server_config=r.server_config,
            load_mode=r.load_mode,
            concurrency=r.concurrency,
            rate=r.rate,
            tok_s_per_gpu=r.tok_s_per_gpu,
            decode_tok_s=r.decode_tok_s,
            aggregate_tok_s=r.aggregate_tok_s,
        )
        for r in rows
        if r.on_frontier
    ]
    return sorted(front, key=lambda r: (str(r["workload"]), r["tok_s_per_gpu"]))


def _known_level(r: CampaignRow) -> float:
    """The level of a row best_per_slo kept (it keeps only rows that have one)."""
    level = r.level
    if level is None:
        raise ValueError(f"point {r.point} has no load level")
    return level


class _Capacity(TypedDict):
    """One configuration at one workload: its best row meeting the SLOs and the lowest failing level above it."""

    config: str
    top: CampaignRow | None
    min_failing: float | None
    steps: Any
    server_config: Any


def _sides(run: Run, rows: list[CampaignRow]) -> list[cmp.Side]:
    return [cmp.Side(run, run.point(r.point), r.point) for r in rows]


def _top_two(run: Run, rows: list[CampaignRow]) -> list[cmp.Side]:
    """The sides of the two configurations with the highest mean aggregate tok/s at each level: the only ones the
    ranking's margin and interval involve (compare.best_per_level re-reads every side it is given)."""
    groups: dict[tuple, dict[str, list[CampaignRow]]] = defaultdict(lambda: defaultdict(list))
    sides = {r.point: _sides(run, [r])[0] for r in rows}
    for r in rows:
        groups[(r.workload, r.load_mode, r.concurrency, r.rate)][cmp.config_label(sides[r.point])].append(r)
    keep = []
    for configs in groups.values():
        ranked = sorted(configs.values(), key=lambda rs: -sum(x.aggregate_tok_s or 0.0 for x in rs) / len(rs))
        keep += [sides[r.point] for rs in ranked[:2] for r in rs]
    return keep


@dataclass(frozen=True)
class PairedDecode:
    """Per-request decode-speed ratio best/runner-up over the requests both points served (> 1: best is faster)."""

    paired_decode_speedup: float | None = None
    paired_ci_low: float | None = None
    paired_ci_high: float | None = None
    pairs: int = 0


def _paired_decode(best: cmp.Side | None, runner: cmp.Side | None, resamples: int) -> PairedDecode:
    if best is None or runner is None:
        return PairedDecode()
    [row] = cmp.paired_speedups(runner, best, resamples, metrics=("decode_tok_s",))
    return PairedDecode(row["speedup"], row["ci_low"], row["ci_high"], row["pairs"])


def best_per_level(
    run: Run, rows: list[CampaignRow], meets: dict[str, bool] | None, resamples: int = RESAMPLES
) -> list[ReportLevelBest]:
    """compare.best_per_level over the valid points that meet the SLOs, with the paired decode-speed ratio."""
    eligible = [r for r in rows if valid(r) and (meets is None or meets.get(r.point))]
    sides = _top_two(run, eligible)
    by_label: dict[tuple, cmp.Side] = {}
    for s in sides:
        p = s.point
        by_label[(p.workload, p.load_mode, p.concurrency, p.rate, cmp.config_label(s))] = s
    out: list[ReportLevelBest] = []
    for b in cmp.best_per_level(sides, resamples, rows={r.point: r for r in rows}):
        key = (b["workload"], b["load_mode"], b["concurrency"], b["rate"])
        best, runner = by_label.get((*key, b["best"])), by_label.get((*key, b["runner_up"]))
        paired = _paired_decode(best, runner, resamples)
        out.append(
            {
                **b,
                "level": b["rate"] if b["load_mode"] not in (None, "closed") else b["concurrency"],
                "best_point": best.point.point if best else None,
                "paired_decode_speedup": paired.paired_decode_speedup,
                "paired_ci_low": paired.paired_ci_low,
                "paired_ci_high": paired.paired_ci_high,
                "pairs": paired.pairs,
            }
        )
    return out


def best_per_slo(
    run: Run, rows: list[CampaignRow], meets: dict[str, bool], slo_text: str, resamples: int = RESAMPLES
) -> list[dict[str, Any]]:
    """Per workload: the configuration meeting the SLOs at the highest level (ties: higher aggregate tok/s there)."""
    groups: dict[Any, dict[str, list[CampaignRow]]] = defaultdict(lambda: defaultdict(list))
    labels: dict[str, str] = {}
    for r in rows:
        if valid(r) and r.level is not None:
            s = _sides(run, [r])[0]
            labels[r.point] = cmp.config_label(s)
            groups[(r.workload, r.load_mode)][labels[r.point]].append(r)
    out = []
    for (workload, mode), configs in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
        caps: list[_Capacity] = []
        for label, pts in configs.items():
            passing = [r for r in pts if meets.get(r.point)]
            failing = [r for r in pts if not meets.get(r.point)]
            top = max(passing, key=lambda r: (_known_level(r), r.aggregate_tok_s or 0.0)) if passing else None
            above = [r for r in failing if top is None or _known_level(r) > _known_level(top)]
            caps.append(
                {
                    "config": label,
                    "top": top,
                    "min_failing": min((_known_level(r) for r in above), default=None),
                    "steps": pts[0].steps,
                    "server_config": pts[0].server_config,
                }
            )
        caps.sort(
            key=lambda c: (
                -_known_level(c["top"]) if c["top"] else float("inf"),
                -(c["top"].aggregate_tok_s or 0.0 if c["top"] else 0),
            )
        )
        best = caps[0]
        runner = caps[1] if len(caps) > 1 else None
        row: dict[str, Any] = {
            "slos": slo_text,
            "workload": workload,
            "load_mode": mode,
            "best": best["config"] if best["top"] else None,
            "steps": best["steps"] if best["top"] else None,
            "server_config": best["server_config"] if best["top"] else None,
            "max_passing": best["top"].level if best["top"] else None,
            "min_failing": best["min_failing"],
            # how that point's cancelled requests were counted (rig.analysis.slo.cancelled_note)
            "max_passing_note": best["top"].slo_note if best["top"] else None,
            "best_aggregate_tok_s": best["top"].aggregate_tok_s if best["top"] else None,
            "runner_up": runner["config"] if runner and runner["top"] else None,
            "runner_up_max_passing": runner["top"].level if runner and runner["top"] else None,
            "capacity_margin": None,
            "throughput_margin": None,
            "ci_low": None,
            "ci_high": None,
        }
        if best["top"] and runner and runner["top"]:
            row["capacity_margin"] = _known_level(best["top"]) / _known_level(runner["top"]) - 1
            same = [r for r in configs[runner["config"]] if r.level == best["top"].level and meets.get(r.point)]
            if same:
                [b] = cmp.best_per_level(
                    _sides(run, [best["top"], same[0]]), resamples, rows={r.point: r for r in rows}
                )
                if b["best"] == best["config"]:
                    row.update(throughput_margin=b["margin"], ci_low=b["ci_low"], ci_high=b["ci_high"])
        out.append(row)
    return out
