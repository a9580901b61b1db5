"""The verdict of `rig prove`: in each load band, each arm (the schedule, the adaptive controller) against the best
static setting there, on the same requests.

- **Best static**: among the static arms' valid points at the level, the highest aggregate tok/s (mean over repeats),
  exactly as the report's schedule ranks them.
- **Margin**: arm / best static - 1, with the schedule's bootstrap 95 % interval (rig.analysis.schedule.interval):
  paired over the requests both served when each side is one point of this run, over repeats when both have two or
  more.
- **Verdict**, a non-inferiority reading of the interval with an equivalence margin (``--tolerance``, 2 %): ``better``
  when the interval lies above 0, ``as good`` when it lies above -tolerance, ``worse`` when it lies below 0 and
  reaches past -tolerance, else ``undecided`` (too wide: measure more requests or repeats); ``not measured`` when
  the arm has no valid point there. A paired interval over one point each holds the request mix fixed but not
  the point's own noise (its makespan, a server hiccup), hence the margin.
- **Across load changes** (a proof on a load profile): per phase, the steady-state output tok/s of each arm against
  the best static arm's, with a paired moving-block bootstrap interval over the steady windows both points share
  (rig.analysis.phase_interval: the windows of one phase are one stretch of time, so they are resampled in blocks)
  and the same verdict reading; then the whole profile as one band.
- **Energy**: J/token of the best static point and of each arm's, as `rig report` computes them (GPU telemetry, or
  the simulator's power model, whose idle draw is part of every figure: the baseline is stated, never subtracted).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from rig.analysis import compare as cmp
from rig.analysis.frontier import valid
from rig.analysis.phase_interval import MIN_WINDOWS, block_interval, shared_windows
from rig.analysis.report import Report
from rig.analysis.rows import SglangAdaptiveConfig, VllmSpeculativeConfig
from rig.analysis.schedule import interval
from rig.analysis.timeline import PhaseSummary, Timeline
from rig.contracts import ArmResult, CampaignRow, ProveBand, ProveSection, ProveSettings, ScheduleSlot
from rig.contracts.prove import BandVerdict

KEY = "aggregate_tok_s"
STEPS_SERIES = "spec_steps"  # the active speculative steps over the point, where the server reports them


def _mean(rows: list[CampaignRow], key: str) -> float | None:
    vals = [r.get(key) for r in rows if r.get(key) is not None]
    return float(np.mean(vals)) if vals else None


def _steps_mean(report: Report, rows: list[CampaignRow]) -> float | None:
    """Time-weighted mean of the active steps over the arm's points (None: no such series)."""
    means = []
    for r in rows:
        s = report.series.get(r.point, {}).get(STEPS_SERIES)
        if s is None or s.empty:
            continue
        if s.ts.size == 1:
            means.append(float(s.values[0]))
            continue
        dt = np.diff(s.ts)
        means.append(float(np.sum(s.values[:-1] * dt) / np.sum(dt)) if np.sum(dt) > 0 else float(s.values[0]))
    return float(np.mean(means)) if means else None


def _verdict(lo: float | None, hi: float | None, tolerance: float) -> BandVerdict:
    """A non-inferiority reading of the interval: better (all above 0), as good (all above -tolerance), worse
    (all below 0, and not within the tolerance), else undecided (too wide to say)."""
    if lo is None or hi is None:
        return "undecided"
    if lo > 0:
        return "better"
    if lo >= -tolerance:
        return "as good"
    if hi < 0:
        return "worse"
    return "undecided"


def _margin_verdict(margin: float, tolerance: float) -> BandVerdict:
    """A margin with no interval, read against the tolerance alone."""
    return "better" if margin > tolerance else "as good" if margin >= -tolerance else "worse"


def judge_arms(section: ProveSection, report: Report, resamples: int = cmp.RESAMPLES, seed: int = cmp.SEED) -> None:
    """Fill ``section.bands`` and ``section.verdict`` from the report of the proof's run."""
    rng = np.random.default_rng(seed)
    tolerance = section.settings.tolerance if section.settings is not None else ProveSettings().tolerance
    kind_of = {a.server_config: a for a in section.arms}
    by_level: dict[tuple[str, str, float], dict[str, list[CampaignRow]]] = defaultdict(lambda: defaultdict(list))
    for r in report.campaign:
        arm = kind_of.get(r.server_config or "")
        if arm is None or r.level is None:
            continue
        # a level whose points are all invalid still gets its band (every arm "not measured" there), so the
        # verdict cannot call an arm as good everywhere while a band went unjudged
        at = by_level[(str(r.workload), str(r.load_mode), float(r.level))]
        if valid(r) and r.get(KEY) is not None:
            at[arm.label].append(r)
    bands = []
    for (workload, mode, level), arms in sorted(by_level.items()):
        band = ProveBand(workload=workload, load_mode=mode, level=level)
        statics = {lab: rs for lab, rs in arms.items() if kind_of[rs[0].server_config or ""].kind == "static"}
        if not statics:
            band.arms = {a.label: ArmResult() for a in section.arms if a.kind != "static"}
        else:
            best_lab, best_rows = max(statics.items(), key=lambda kv: _mean(kv[1], KEY) or 0.0)
            band.best_static, band.best_static_steps = best_lab, best_rows[0].steps
            band.best_static_value = _mean(best_rows, KEY)
            band.best_static_j_per_token = _mean(best_rows, "j_per_token")
            for arm in section.arms:
                if arm.kind == "static":
                    continue
                rows = arms.get(arm.label)
                if not rows:
                    band.arms[arm.label] = ArmResult()
                    continue
                lo, hi, method = interval(report.run, rows, best_rows, KEY, True, rng, resamples)
                value = _mean(rows, KEY)
                best = band.best_static_value
                band.arms[arm.label] = ArmResult(
                    value=value,
                    margin=(value / best - 1) if value is not None and best else None,
                    ci_low=lo,
                    ci_high=hi,
                    ci_method=method,
                    verdict=_verdict(lo, hi, tolerance),
                    j_per_token=_mean(rows, "j_per_token"),
                    steps_mean=_steps_mean(report, rows),
                )
        bands.append(band)
    section.bands = bands
    section.verdict = summarize(section)
    unreachable = _unreachable_slots(section, report)
    if unreachable:
        section.schedule_note = "; ".join([n for n in (section.schedule_note, unreachable) if n])
    power = [r.mean_power_w for r in report.campaign if r.mean_power_w is not None]
    if power:
        section.energy_note = (
            f"J/token from {report.campaign[0].energy_source or 'the GPU samples'}: the servers' whole draw "
            f"(idle included, not subtracted; mean power {min(power):.0f}-{max(power):.0f} W across points)"
        )


def _phase_band(
    workload: str,
    phase: int,
    label: str,
    by_arm: dict[str, float | None],
    statics: set[str],
    steps: dict[str, float | None],
    tolerance: float,
    windows: dict[str, dict[float, float]] | None = None,
    rng: np.random.Generator | None = None,
    resamples: int = cmp.RESAMPLES,
    static_steps: dict[str, int] | None = None,
) -> ProveBand:
    """One phase: the best static arm's steady-state tok/s, and each other arm's margin over it, with the paired
    block-bootstrap interval over the steady windows both share (rig.analysis.phase_interval) and the verdict read
    off it as in the bands; with too few shared windows (or none given), the verdict is the margin's against the
    tolerance and the method says so. An arm whose figure is None (its point flagged invalid, or no steady span) is
    'not measured' there; ``static_steps``: the static arms' steps by label (the best one's are kept)."""
    band = ProveBand(workload=workload, load_mode="profile phase", level=float(phase), phase=phase, label=label)
    measured = {lab: v for lab, v in by_arm.items() if lab in statics and v is not None}
    if not measured:  # every static point flagged (or without a steady span): nothing to judge the arms against
        band.arms = {lab: ArmResult() for lab in by_arm if lab not in statics}
        return band
    best = max(measured, key=lambda k: measured[k] or 0.0)
    band.best_static, band.best_static_value = best, measured[best]
    band.best_static_steps = (static_steps or {}).get(best)
    for lab, v in by_arm.items():
        if lab in statics:
            continue
        if v is None:
            band.arms[lab] = ArmResult(steps_mean=steps.get(lab))
            continue
        margin = v / measured[best] - 1
        ci = None
        if windows and lab in windows and best in windows:
            a, b = shared_windows(windows[lab], windows[best])
            ci = block_interval(a, b, margin, rng or np.random.default_rng(cmp.SEED), resamples)
        lo, hi, method = ci or (
            None,
            None,
            f"margin against the tolerance (fewer than {MIN_WINDOWS} steady windows shared: no interval)",
        )
        verdict = _verdict(lo, hi, tolerance) if ci is not None else _margin_verdict(margin, tolerance)
        band.arms[lab] = ArmResult(
            value=v, margin=margin, ci_low=lo, ci_high=hi, ci_method=method, verdict=verdict, steps_mean=steps.get(lab)
        )
    return band


def judge_phases(section: ProveSection, report: Report, resamples: int = cmp.RESAMPLES, seed: int = cmp.SEED) -> None:
    """Fill ``section.phases`` from a proof run on a load profile: per phase, each arm's steady-state tok/s against
    the best static arm's (rig.analysis.timeline's steady spans: ramp-up and drain excluded), with a block-bootstrap
    interval over the steady windows both share; then the whole profile, each arm's aggregate tok/s against the
    best static arm's with the paired interval of the bands."""
    tolerance = section.settings.tolerance if section.settings is not None else ProveSettings().tolerance
    rng = np.random.default_rng(seed)
    arm_of = {a.server_config: a for a in section.arms}
    static_steps = {a.label: a.steps for a in section.arms if a.kind == "static"}
    statics = set(static_steps)
    timelines = {t.point: t for t in report.timelines}
    by_phase: dict[tuple[str, int], dict[str, float | None]] = defaultdict(dict)
    steps: dict[tuple[str, int], dict[str, float | None]] = defaultdict(dict)
    steady: dict[tuple[str, int], dict[str, dict[float, float]]] = defaultdict(dict)
    labels: dict[int, str] = {}
    for r in report.campaign:
        arm = arm_of.get(r.server_config or "")
        tl = timelines.get(r.point)
        if arm is None or tl is None:
            continue
        for ph in tl.phases:
            key = (str(r.workload), ph.phase)
            labels[ph.phase] = ph.label
            if not valid(r):  # flagged (a busy host: sim_behind): the arm is in the phase, 'not measured' there
                by_phase[key][arm.label] = None
                continue
            by_phase[key][arm.label] = ph.output_tok_s
            steps[key][arm.label] = ph.spec_steps
            steady[key][arm.label] = _steady_windows(tl, ph)
    for by_arm in by_phase.values():  # an arm with no point to read (failed, or not run) is 'not measured' too
        for a in section.arms:
            by_arm.setdefault(a.label, None)
    section.phases = [
        _phase_band(
            w, ph, labels[ph], by_arm, statics, steps[(w, ph)], tolerance, steady[(w, ph)], rng, resamples, static_steps
        )
        for (w, ph), by_arm in sorted(by_phase.items())
    ]
    whole = ProveSection(settings=section.settings, arms=section.arms)
    judge_arms(whole, report, resamples, seed)  # each profiled point is one campaign row: the band is the profile
    for b in whole.bands:
        section.phases.append(b.model_copy(update={"load_mode": "profile", "label": "whole profile"}))
    section.verdict = summarize_phases(section)


def _steady_windows(tl: Timeline, ph: PhaseSummary) -> dict[float, float]:
    """The phase's windows that lie wholly inside its steady span, by start (seconds into the profile)."""
    if ph.steady_from_s is None or ph.steady_to_s is None:
        return {}
    return {
        w.start_s: w.output_tok_s
        for w in tl.windows
        if w.phase == ph.phase and w.start_s >= ph.steady_from_s and w.end_s <= ph.steady_to_s
    }


def summarize_phases(section: ProveSection) -> str:
    """One line per arm across the load changes: the phases where it fell behind the best static setting, and its
    verdict over the whole profile."""
    lines = []
    for arm in section.arms:
        if arm.kind == "static":
            continue
        phases = [(b, b.arms.get(arm.label)) for b in section.phases if b.phase is not None and b.best_static]
        behind = [b.label or str(b.phase) for b, a in phases if a is not None and a.verdict == "worse"]
        whole = next((b.arms.get(arm.label) for b in section.phases if b.load_mode == "profile"), None)
        overall = f"whole profile {whole.verdict}" if whole is not None else "whole profile not measured"
        if whole is not None and whole.margin is not None:
            overall += f" ({whole.margin * 100:+.1f}% vs the best static setting)"
        judged = [a for _, a in phases if a is not None and a.verdict != "not measured"]
        if behind:
            head = f"{arm.label}: behind the best static setting in phase(s) {', '.join(behind)}"
        elif not judged:
            head = f"{arm.label}: not proved (no valid point to judge a phase on: see the points' flags)"
        else:
            head = f"{arm.label}: as good as the best static setting in every phase"
        lines.append(f"{head}; {overall}")
    return "\n".join(lines) if lines else "no arm besides the static settings was measured"


def schedule_slots(
    report: Report, workload: str, engine: str = "sglang"
) -> tuple[list[ScheduleSlot], SglangAdaptiveConfig | VllmSpeculativeConfig | None, str]:
    """The closed-loop schedule of ``workload`` by running batch (rig.analysis.engine_schedule, as `rig report`
    writes it) as slots, the engine's own configuration for it (SGLang's adaptive config, or vLLM's speculative
    config with ``num_speculative_tokens_per_batch_size`` for ``engine`` vllm; None: nothing to launch), and how it
    was derived."""
    entry = next((e for e in report.engine_schedule if e["workload"] == workload and e["load_mode"] == "closed"), None)
    if entry is None:
        return [], None, f"no closed-loop schedule for workload {workload} (it needs two or more settings measured)"
    slots = []
    for lo, _hi, steps in entry["ranges"]:
        band = next((b for b in entry["bands"] if b["steps"] == steps), None)
        slots.append(
            ScheduleSlot(
                batch_size=lo,
                steps=steps,
                level=band["level"] if band else 0.0,
                running_mean=band["running_batch"] if band else None,
            )
        )
    note = "slots keyed by the running batch the best setting kept at each band's level (rig report's engine schedule)"
    config = entry["vllm_speculative_config"] if engine == "vllm" else entry["sglang_adaptive_config"]
    return slots, config, "; ".join([note, *entry["notes"]])


def _unreachable_slots(section: ProveSection, report: Report) -> str | None:
    """The schedule's slots the schedule server could never reach: SGLang sizes its running batch by the startup
    steps (the largest of the schedule, so every tier fits), and a slot keyed above that cap never switches."""
    arm = next((a for a in section.arms if a.kind == "schedule"), None)
    if arm is None:
        return None
    entry = report.run.manifest.server_configs.get(arm.server_config)
    cap = (entry.startup or {}).get("max_running_requests") if entry is not None else None
    if not isinstance(cap, int):
        return None
    above = [s for s in section.schedule if s.batch_size > cap]
    if not above:
        return None
    return (
        f"the schedule server holds at most {cap} running requests (sized for its startup steps {arm.steps}): "
        + ", ".join(f"the slot from batch {s.batch_size} (steps {s.steps})" for s in above)
        + " is never reached, so it runs the slot below there"
    )


def summarize(section: ProveSection) -> str:
    """One line per arm: as good as (or better than) the best static setting in every band, or where not."""
    lines = []
    tol = section.settings.tolerance if section.settings is not None else ProveSettings().tolerance
    for arm in section.arms:
        if arm.kind == "static":
            continue
        results = [(b, b.arms.get(arm.label) if b.best_static is not None else None) for b in section.bands]
        worse = [f"{b.level:g}" for b, a in results if a is not None and a.verdict == "worse"]
        unmeasured = [f"{b.level:g}" for b, a in results if a is None or a.verdict in ("not measured", "undecided")]
        better = [f"{b.level:g}" for b, a in results if a is not None and a.verdict == "better"]
        if worse:
            head = f"{arm.label}: worse than the best static setting at level(s) {', '.join(worse)}"
        elif unmeasured:
            head = f"{arm.label}: not proved (unmeasured or undecided at level(s) {', '.join(unmeasured)})"
        else:
            head = f"{arm.label}: as good as the best static setting in every band (within {tol:.0%})"
        if better:
            head += f"; better at {', '.join(better)}"
        lines.append(head)
    return "\n".join(lines) if lines else "no arm besides the static settings was measured"


def _pct(v: float | None) -> str:
    return "" if v is None else f"{v * 100:+.1f}%"


def prove_table(section: ProveSection) -> Any:
    """The proof as a terminal table: per band the best static setting, then each arm's margin, interval, verdict."""
    from rich.table import Table

    arms = [a for a in section.arms if a.kind != "static"]
    rows = section.phases or section.bands
    title = (
        f"rig prove across load changes ({section.profile}): each arm against the best static setting, per phase "
        "(steady-state output tok/s) and over the whole profile (aggregate tok/s, paired interval)"
        if section.phases
        else "rig prove: each arm against the best static setting, per load band (aggregate tok/s)"
    )
    t = Table(title=title)
    for head in ("Workload", "Phase" if section.phases else "Level", "Best static", "tok/s", "J/tok"):
        t.add_column(head, justify="right" if head in ("Level", "tok/s", "J/tok") else "left")
    for a in arms:
        t.add_column(f"{a.label} tok/s", justify="right")
        t.add_column(f"{a.label} vs best [95% CI]", justify="right")
        t.add_column(f"{a.label} steps", justify="right")
    for b in rows:
        cells = [
            b.workload,
            b.label or f"{b.level:g}",
            b.best_static or "",
            "" if b.best_static_value is None else f"{b.best_static_value:,.0f}",
            "" if b.best_static_j_per_token is None else f"{b.best_static_j_per_token:.3f}",
        ]
        for a in arms:
            r = b.arms.get(a.label) or ArmResult()
            ci = f" [{_pct(r.ci_low)}, {_pct(r.ci_high)}]" if r.ci_low is not None else ""
            cells += [
                "" if r.value is None else f"{r.value:,.0f}",
                f"{_pct(r.margin)}{ci} {r.verdict}",
                "" if r.steps_mean is None else f"{r.steps_mean:.2f}",
            ]
        t.add_row(*cells)
    notes = [n for n in (section.schedule_note, section.adaptive_note, section.energy_note) if n]
    if section.schedule:
        notes.insert(0, "schedule: " + ", ".join(f"batch >= {s.batch_size}: steps {s.steps}" for s in section.schedule))
    t.caption = "\n".join([*(section.verdict or "").splitlines(), *notes])
    return t
