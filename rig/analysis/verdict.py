"""The answer first: a run's health and, per workload, the best setting in each load band with its margin and CI and
where the answer changes, in a few lines that open ``rig report`` (terminal and HTML)."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, TypedDict

from rig.analysis.points import INVALIDATING
from rig.analysis.report import Report
from rig.analysis.rows import ScheduleGroup
from rig.analysis.runs import Run
from rig.analysis.settings import grid_knobs, setting_name
from rig.contracts import CampaignRow


class HealthRow(TypedDict):
    """The run's health as a row (``rig.open_run(...).section("health")``)."""

    points: int
    valid: int
    flagged: dict[str, list[str]]
    notes: dict[str, list[str]]
    not_complete: list[str]
    requests: int
    ok: int
    failed: int
    cancelled: int
    lossless: str
    lossless_detail: str
    good: bool


@dataclass
class Health:
    """How far the run's numbers can be trusted: points valid or flagged, requests failed, losslessness."""

    points: int
    valid: int
    flagged: dict[str, list[str]]  # an invalidating flag -> the points that carry it
    notes: dict[str, list[str]]  # a flag that only notes something -> its points
    not_complete: list[str]  # points whose status is not complete
    requests: int
    ok: int
    failed: int
    cancelled: int
    lossless: str  # "ok", "mismatch", "nothing to compare" or "not checked" (no temperature-0 request compared)
    lossless_detail: str

    @property
    def good(self) -> bool:
        return self.valid == self.points and not self.failed and not self.not_complete and self.lossless != "mismatch"

    def to_dict(self) -> HealthRow:
        return HealthRow(
            points=self.points, valid=self.valid, flagged=self.flagged, notes=self.notes,
            not_complete=self.not_complete, requests=self.requests, ok=self.ok, failed=self.failed,
            cancelled=self.cancelled, lossless=self.lossless, lossless_detail=self.lossless_detail, good=self.good,
        )  # fmt: skip


@dataclass
class BandLine:
    """One load band's answer: from ``level`` (up to the next band's), the best setting and its margin."""

    level: float
    best: str | None
    value: float | None
    runner_up: str | None
    margin: float | None
    ci_low: float | None
    ci_high: float | None
    decided: bool | None
    missing: list[str]


@dataclass
class Crossover:
    """Where the best setting changes between two bands."""

    level: float  # the first level of the new answer
    was: str
    now: str
    decided: bool
    incomplete: list[str]


@dataclass
class WorkloadVerdict:
    """One (workload, load mode): what is best where, ranked by ``objective`` among ``among``."""

    workload: str
    load_mode: str
    objective: str
    among: str
    settings: list[str]
    bands: list[BandLine] = field(default_factory=list)
    crossovers: list[Crossover] = field(default_factory=list)


@dataclass
class Verdict:
    health: Health
    workloads: list[WorkloadVerdict]


def setting_labels(rows: list[CampaignRow], run: Run | None = None) -> dict[Any, str]:
    """'steps=N' per server configuration ('adaptive(start steps=N)' for an adaptive server of ``run``); where two
    configurations share a steps value, with the knob values that tell them apart (rig.analysis.settings.grid_knobs),
    else its id (as the schedule and rig compare name them)."""
    configs: dict[Any, set[Any]] = defaultdict(set)
    for r in rows:
        configs[r.steps].add(r.server_config)
    knobs = grid_knobs(run) if run is not None else {}
    return {
        r.server_config: setting_name(
            r.steps,
            r.server_config,
            knobs.get(r.server_config or ""),
            len(configs[r.steps]) > 1,
            adaptive=run is not None and run.server_config(r.server_config).adaptive is not None,
        )
        for r in rows
    }


def health(report: Report) -> Health:
    """The run's health from its campaign rows and the losslessness check."""
    flagged: dict[str, list[str]] = defaultdict(list)
    notes: dict[str, list[str]] = defaultdict(list)
    valid = 0
    for r in report.campaign:
        bad = sorted(set(r.flags) & INVALIDATING)
        for f in bad:
            flagged[f].append(r.point)
        for f in sorted(set(r.flags) - INVALIDATING):
            notes[f].append(r.point)
        valid += int(r.aggregate_tok_s is not None and not bad)
    ll = report.lossless
    if ll.groups_checked == 0:
        lossless, detail = "nothing to compare", "no two points share requests across speculative settings"
    elif ll.requests_checked == 0:
        lossless, detail = "not checked", "no temperature-0 requests"
    elif ll.ok:
        lossless, detail = "ok", f"{ll.requests_checked:,} temperature-0 requests compared"
    else:
        lossless, detail = "mismatch", f"{len(ll.mismatches)} mismatching request(s)"
    rows = report.campaign
    return Health(
        points=len(rows),
        valid=valid,
        flagged=dict(flagged),
        notes=dict(notes),
        not_complete=[r.point for r in rows if r.status not in (None, "complete")],
        requests=sum(r.requests for r in rows),
        ok=sum(r.ok or 0 for r in rows),
        failed=sum(r.failed or 0 for r in rows),
        cancelled=sum(r.cancelled or 0 for r in rows),
        lossless=lossless,
        lossless_detail=detail,
    )


def _among(report: Report) -> str:
    from rig.analysis.slo import describe

    return f"points meeting {describe(report.slos, report.slo_percentile)}" if report.slos else "valid points"


def _from_schedule(s: ScheduleGroup, among: str) -> WorkloadVerdict:
    bands = [
        BandLine(
            level=b["level"],
            best=b["best"],
            value=b["value"],
            runner_up=b["runner_up"],
            margin=b["margin"],
            ci_low=b["ci_low"],
            ci_high=b["ci_high"],
            decided=b["decided"],
            missing=list(b["missing"]),
        )
        for b in s["bands"]
    ]
    crossovers = [
        Crossover(c["to_level"], c["from"], c["to"], bool(c["decided"]), list(c.get("incomplete") or []))
        for c in s["crossovers"]
    ]
    settings = [e["config"] for e in s["at_slo_limit"]]
    return WorkloadVerdict(s["workload"], s["load_mode"], s["objective"], among, settings, bands, crossovers)


def verdict(report: Report) -> Verdict:
    """The health, and per (workload, load mode) the schedule's bands and crossovers; a workload measured with one
    setting only is listed with no bands (nothing to rank)."""
    among = _among(report)
    out = [_from_schedule(s, among) for s in report.schedule]
    ranked = {(w.workload, w.load_mode) for w in out}
    labels = setting_labels(report.campaign, report.run)
    alone: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in report.campaign:
        key = (str(r.workload), str(r.load_mode))
        if key not in ranked:
            alone[key].add(labels[r.server_config])
    for (workload, mode), settings in sorted(alone.items()):
        out.append(WorkloadVerdict(workload, mode, report.objective, among, sorted(settings)))
    return Verdict(health(report), sorted(out, key=lambda w: (w.workload, w.load_mode)))


# ------------------------------------------------------------------ words


def level_text(level: float, load_mode: str) -> str:
    return f"C={level:g}" if load_mode in ("closed", "None") else f"rate={level:g} req/s"


def value_text(value: float, objective: str) -> str:
    if objective == "throughput":
        return f"{value:,.1f} tok/s"
    if objective == "j_per_token":
        return f"{value:.3f} J/token"
    return f"${value:,.3f}/Mtok"


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def band_text(b: BandLine, w: WorkloadVerdict) -> str:
    """'from C=4: steps=3 1,914.0 tok/s, +5.3% over steps=4 (95% CI +2.1% … +8.0%)'."""
    head = f"from {level_text(b.level, w.load_mode)}: "
    if b.best is None or b.value is None:
        return head + f"nothing among {w.among}"
    text = head + f"{b.best} {value_text(b.value, w.objective)}"
    if b.runner_up is None or b.margin is None:
        why = f"no valid point of {', '.join(b.missing)}" if b.missing else "no other setting qualifies"
        return text + f", alone ({why})"
    text += f", {_pct(b.margin)} over {b.runner_up}"
    if b.ci_low is None or b.ci_high is None:
        return text + " (no interval)"
    return text + f" (95% CI {_pct(b.ci_low)} … {_pct(b.ci_high)}" + ("" if b.decided else "; not decided") + ")"


def crossover_text(c: Crossover, load_mode: str) -> str:
    text = f"{c.was} → {c.now} at {level_text(c.level, load_mode)}"
    if c.incomplete:
        return text + f" (incomplete: no valid point of {', '.join(c.incomplete)})"
    return text + ("" if c.decided else " (not decided: the CI spans 0)")


def health_text(h: Health) -> list[str]:
    """The health in two lines: points, then requests and losslessness."""
    points = f"{h.points} point(s): {h.valid} valid"
    if h.flagged:
        points += ", flagged invalid: " + "; ".join(f"{f} ({len(ps)})" for f, ps in sorted(h.flagged.items()))
    if h.not_complete:
        points += f"; {len(h.not_complete)} not complete"
    if h.notes:
        points += " · notes: " + ", ".join(f"{f} ({len(ps)})" for f, ps in sorted(h.notes.items()))
    reqs = f"{h.requests:,} request(s): {h.ok:,} ok, {h.failed:,} failed, {h.cancelled:,} cancelled"
    lossless = {"ok": "OK", "mismatch": "MISMATCH"}.get(h.lossless, h.lossless)
    return [points, f"{reqs} · greedy losslessness: {lossless} ({h.lossless_detail})"]


def workload_lines(w: WorkloadVerdict) -> tuple[str, list[str]]:
    """A workload's heading (after its name) and its lines: one per band, then the crossovers."""
    from rig.analysis.columns import OBJECTIVE_TEXT

    mode = "closed loop" if w.load_mode in ("closed", "None") else "open loop"
    if not w.bands:
        return mode, [f"one setting measured ({', '.join(w.settings)}): nothing to rank"]
    head = f"{mode} · best by {OBJECTIVE_TEXT.get(w.objective, w.objective)} among {w.among}"
    lines = [band_text(b, w) for b in w.bands]
    if w.crossovers:
        lines += ["crossover: " + crossover_text(c, w.load_mode) for c in w.crossovers]
    elif any(b.best for b in w.bands):
        lines.append("no crossover: the same setting is best wherever one qualifies")
    return head, lines


def safe_name(text: str) -> str:
    """A string usable as a file name."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("_") or "x"


def figure_name(workload: str, load_mode: str) -> str:
    """The stem of a workload's verdict figure (rig report --plots)."""
    return f"verdict_{safe_name(workload)}_{safe_name(load_mode)}"
