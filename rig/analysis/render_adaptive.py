"""The report's sections on speculation that changes by load: the steps a server actually ran per point (and what
each tier measured), and the schedule by running batch in the engines' own words (terminal and HTML)."""

from __future__ import annotations

import json
from typing import TypedDict

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from rig.analysis import declared
from rig.analysis.active_steps import ACCEPT_RATE_NOTE, ActiveStepsRow, worth_showing
from rig.analysis.columns import Column
from rig.analysis.engine_schedule import EngineSchedule
from rig.analysis.report import Report

ACTIVE_STEPS = [
    Column("point", "Point"),
    Column("adaptive", "Candidate steps by slot", missing="fixed"),
    Column("startup_steps", "Start steps", "d"),
    Column("mean", "Mean steps", ".2f"),
    Column("min", "Min", "d"),
    Column("max", "Max", "d"),
    Column("switches", "Switches", "d"),
    Column("time_in_tiers", "Time in each tier"),
    Column("mixed_windows", "Mixed windows", "d"),
]
TIERS = [
    Column("point", "Point"),
    Column("tier", "Steps", "d"),
    Column("seconds", "Time", ",.1f", "s"),
    Column("share", "Share", ".0%"),
    Column("windows", "Windows", "d"),
    Column("accept_length", "Accept len", ".2f"),
    Column("gen_tok_s", "Server tok/s", ",.1f"),
]
BATCH_BANDS = [
    Column("level", "Band from", "level"),
    Column("best", "Best"),
    Column("running_batch", "Running batch", ".1f"),
]
ACTIVE_TITLE = (
    "Active speculative steps per point (sglang:spec_num_steps, time-weighted; each scrape held until the next)"
)
TIER_TITLE = "Acceptance and throughput by active tier (scrape windows wholly in one tier; mixed windows left out)"


class StepsLine(ActiveStepsRow):
    """A point's active-steps row with its time in each tier as text."""

    time_in_tiers: str


class TierLine(TypedDict):
    """One tier of one point, as its table shows it."""

    point: str
    tier: int
    seconds: float
    share: float
    windows: int
    accept_length: float | None
    gen_tok_s: float | None


def steps_lines(rows: list[ActiveStepsRow]) -> list[StepsLine]:
    return [
        StepsLine(**r, time_in_tiers=" · ".join(f"{t['tier']}: {t['share']:.0%}" for t in r["tiers"])) for r in rows
    ]


def tier_lines(rows: list[ActiveStepsRow]) -> list[TierLine]:
    return [TierLine(point=r["point"], **t) for r in rows if r["adaptive"] or r["switches"] for t in r["tiers"]]


def active_steps_tables(report: Report) -> list[RenderableType]:
    """The active-steps tables, where a point is adaptive or its steps moved."""
    if not worth_showing(report.active_steps):
        return []
    t = Table(title=ACTIVE_TITLE, title_justify="left", header_style="bold")
    declared.fill(t, ACTIVE_STEPS, steps_lines(report.active_steps), fold=True)
    tiers = Table(title=TIER_TITLE, title_justify="left", header_style="bold")
    declared.fill(tiers, TIERS, tier_lines(report.active_steps), fold=True)
    return [t, tiers, Text(f"Note: {ACCEPT_RATE_NOTE}", style="dim")]


def config_lines(s: EngineSchedule) -> list[str]:
    """The command lines and configs of one schedule, or why there are none."""
    out = [f"Ranges by running batch [start, end, steps]: {s['ranges'] or 'none'}"]
    if s["vllm_command"]:
        out += [f"vLLM ({s['files']['vllm']}): {s['vllm_command']}"]
    if s["sglang_command"]:
        config = json.dumps(s["sglang_adaptive_config"])
        out += [f"SGLang ({s['files']['sglang']}): {config}", f"  {s['sglang_command']}"]
    out += [f"note: {n}" for n in s["notes"]]
    return out


def engine_schedule_parts(report: Report) -> list[RenderableType]:
    """Per workload: the bands by running batch, and the vLLM and SGLang configs with their command lines."""
    out: list[RenderableType] = []
    for s in report.engine_schedule:
        t = Table(
            title=f"Schedule by running batch · {s['workload']} ({s['load_mode']}): each band's best setting and the "
            "batch the server kept there (time-weighted mean per DP rank)",
            title_justify="left",
            header_style="bold",
        )
        declared.fill(t, BATCH_BANDS, s["bands"])
        out += [t, Text("\n".join(config_lines(s)))]
    return out
