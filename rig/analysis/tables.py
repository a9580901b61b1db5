"""The campaign table: one row per point, grouped per (server configuration, workload), and its terminal rendering."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from rig.analysis.columns import fmt
from rig.analysis.points import INVALIDATING, campaign_row, load_requests, sort_key
from rig.analysis.runs import Run, load_run
from rig.contracts import CampaignRow

# Keys every campaign row carries (rig report --json); documented in the README.
CAMPAIGN_KEYS = (
    "point",
    "server_config",
    "engine",
    "steps",
    "workload",
    "load_mode",
    "concurrency",
    "rate",
    "achieved_rate",
    "repeat",
    "status",
    "requests",
    "aggregate_tok_s",
    "per_request_tok_s",
    "decode_tok_s",
    "tokens",
    "wall_s",
    "first_send_ts",
    "last_end_ts",
    "ok",
    "failed",
    "cancelled",
    "accept_length",
    "accept_source",
    "flags",
    "flag_reasons",
    "error",
    "errors",
)


def campaign_table(run_dir: Path | str | Run, gpu_hour_price: float | None = None) -> list[CampaignRow]:
    """Every point's campaign row, in table order, with its place on the Pareto frontier, and its energy and cost
    where the run has GPU telemetry or a price (rig.analysis.energy); works on partial runs (points without rows
    have null rates)."""
    from rig.analysis.energy import add_energy
    from rig.analysis.frontier import mark_frontier

    run = run_dir if isinstance(run_dir, Run) else load_run(run_dir)
    rows = [campaign_row(run, p, load_requests(run, p)) for p in run.points]
    mark_frontier(run, rows)
    add_energy(run, rows, gpu_hour_price)
    return sorted(rows, key=sort_key)


def group_rows(rows: Iterable[CampaignRow]) -> list[tuple[tuple[Any, Any], list[CampaignRow]]]:
    """Rows grouped per (server configuration, workload), in first-seen order."""
    groups: dict[tuple[Any, Any], list[CampaignRow]] = {}
    for r in rows:
        groups.setdefault((r.get("server_config"), r.get("workload")), []).append(r)
    return list(groups.items())


def group_title(
    rows: list[CampaignRow], knobs: Mapping[str, str] | None = None, adaptive: frozenset[str] = frozenset()
) -> str:
    """'workload · config (engine, steps=N, knob=value...)' for a group of campaign rows (``knobs``: the values that
    differ between the run's configurations, rig.analysis.settings.grid_knobs); 'adaptive, start steps=N' for a
    server configuration in ``adaptive`` (its steps change by themselves)."""
    r = rows[0]
    steps = None if r.get("steps") is None else f"steps={r['steps']}"
    if steps and r.get("server_config") in adaptive:
        steps = f"adaptive, start {steps}"
    bits = [b for b in (r.get("engine"), steps, (knobs or {}).get(r.get("server_config") or "")) if b]
    return f"{r.get('workload') or '?'} · {r.get('server_config') or '?'}" + (f" ({', '.join(bits)})" if bits else "")


def _level_header(rows: list[CampaignRow]) -> tuple[str, Callable[[CampaignRow], str]]:
    if all(r.get("load_mode") in (None, "closed") for r in rows):
        return "Concurrency", lambda r: fmt(r.get("concurrency"), "d")
    return (
        "Rate (req/s)",
        lambda r: (
            fmt(r.get("concurrency"), "d") + " (C)"
            if r.get("load_mode") in (None, "closed")
            else fmt(r.get("rate"), ",.2f")
        ),
    )


def _flags_cell(flags: list[str]) -> Text:
    if not flags:
        return Text("")
    bad = any(f in INVALIDATING for f in flags)
    return Text(", ".join(flags), style="bold red" if bad else "yellow")


def adaptive_configs(run: Run) -> frozenset[str]:
    """The run's server configurations that ran SGLang's adaptive speculation."""
    return frozenset(cid for cid, entry in run.manifest.server_configs.items() if entry.adaptive is not None)


def render_campaign_table(
    rows: list[CampaignRow], knobs: Mapping[str, str] | None = None, adaptive: frozenset[str] = frozenset()
) -> Group:
    """The campaign's table, one rich Table per (server configuration, workload), titled with its grid knobs."""
    tables = []
    for _, grp in group_rows(rows):
        header, level = _level_header(grp)
        show_repeat = len({r.get("repeat") for r in grp}) > 1
        t = Table(title=group_title(grp, knobs, adaptive), title_justify="left", header_style="bold")
        t.add_column(header, justify="right")
        if show_repeat:
            t.add_column("Repeat", justify="right")
        for name in (
            "Aggregate tok/s",
            "Per-request tok/s",
            "Decode tok/s",
            "Tokens",
            "Wall time (s)",
            "OK",
            "Failed",
            "Accept len",
        ):
            t.add_column(name, justify="right")
        t.add_column("Flags")
        for r in grp:
            cells = [level(r)]
            if show_repeat:
                cells.append(fmt(r.get("repeat"), "d"))
            cells += [
                fmt(r.get("aggregate_tok_s")),
                fmt(r.get("per_request_tok_s")),
                fmt(r.get("decode_tok_s")),
                fmt(r.get("tokens"), ",d"),
                fmt(r.get("wall_s")),
                fmt(r.get("ok"), "d"),
                fmt(r.get("failed"), "d"),
                fmt(r.get("accept_length"), ".2f"),
            ]
            t.add_row(*cells, _flags_cell(r.get("flags") or []))
        tables.append(t)
    return Group(*tables)


def render_problems(rows: list[CampaignRow]) -> Text | None:
    """What went wrong, per point: its error, each flag with the figure that tripped it, its top error messages
    with counts. None when nothing did."""
    out = Text()
    for r in rows:
        reasons = r.get("flag_reasons") or {}
        if not (r.get("error") or reasons or r.get("errors")):
            continue
        out.append(f"{r['point']}", style="bold")
        out.append(f"  ({r.get('status') or 'unknown'})\n")
        if r.get("error"):
            out.append(f"  error: {r['error']}\n", style="red")
        for flag, why in reasons.items():
            out.append(f"  {flag}: ", style="bold red" if flag in INVALIDATING else "yellow")
            out.append(f"{why}\n")
        for e in r.get("errors") or []:
            out.append(f"  {e['count']:>7,} x {e['status']}: {e['error']}\n")
    if not out.plain:
        return None
    return Text("What went wrong (per point)\n", style="bold") + out
