"""The speculative schedule by load, in the engine's own words: bands of offered load become slots of the server's
running batch, written as an SGLang adaptive config whose slots each hold one candidate.

SGLang routes a batch to a slot by padding it to a captured CUDA-graph size and taking the largest slot key at or
below it (srt/speculative/adaptive_step_router.py, ``batch_size_key_for_batch``); a slot with one candidate keeps
that candidate (adaptive_spec_params.py: ``AdaptiveStepSlot`` moves only among its candidates). So a band that
opens at offered load L becomes a slot keyed by the running batch measured at L (the server's own
``num_running_reqs`` gauge, time-weighted over the point), and the first slot is keyed 1 so that every batch has one.
"""

from __future__ import annotations

from typing import Any

from rig.analysis.report import Report
from rig.contracts import ScheduleSlot

SCHEDULE_FILE = "prove/sglang_adaptive_config.json"  # where `rig prove` writes the schedule arm's config


def _running_at(report: Report, workload: str, level: float, steps: int | None) -> float | None:
    """The mean running batch the server reported at ``level`` for the setting with ``steps`` (None: no gauge)."""
    by_point = {r.point: r for r in report.server}
    vals = [
        by_point[c.point].running_mean
        for c in report.campaign
        if c.workload == workload
        and c.load_mode == "closed"
        and c.concurrency == level
        and c.steps == steps
        and c.point in by_point
        and by_point[c.point].running_mean is not None
    ]
    return sum(v for v in vals if v is not None) / len(vals) if vals else None


def schedule_slots(report: Report, workload: str) -> tuple[list[ScheduleSlot], str | None]:
    """The closed-loop schedule of ``workload`` as batch-size slots (merged where the steps do not change), and a
    note on how they were derived (or why there are none)."""
    group = next((s for s in report.schedule if s["workload"] == workload and s["load_mode"] == "closed"), None)
    if group is None:
        return [], f"no closed-loop schedule for workload {workload} (it needs two or more settings measured)"
    slots: list[ScheduleSlot] = []
    guessed: list[str] = []
    for band in group["bands"]:
        if band["best_steps"] is None:
            continue
        running = _running_at(report, workload, band["level"], band["best_steps"])
        if running is None:
            guessed.append(f"{band['level']:g}")
        key = 1 if not slots else max(1, round(running if running is not None else band["level"]))
        if slots and slots[-1].steps == band["best_steps"]:
            continue
        if slots and key <= slots[-1].batch_size:  # the running batch stopped growing (the server's cap)
            continue
        slots.append(ScheduleSlot(batch_size=key, steps=band["best_steps"], level=band["level"], running_mean=running))
    note = "slots keyed by the running batch the server reported at each band's level"
    if guessed:
        note += f"; at level(s) {', '.join(guessed)} the server reported none, so the offered load stands in for it"
    return slots, note


def sglang_adaptive_config(slots: list[ScheduleSlot]) -> dict[str, Any]:
    """The slots as SGLang's --speculative-adaptive-config JSON (integer-string keys, one candidate each)."""
    return {str(s.batch_size): {"candidate_steps": [s.steps]} for s in slots}
