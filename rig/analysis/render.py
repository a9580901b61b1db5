"""Terminal rendering of a report's sections (rich tables), next to the campaign table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from rig.analysis import columns, declared
from rig.analysis.lossless import mismatch_rows, not_checked_reason
from rig.analysis.report import Report
from rig.analysis.rows import LatencyRow
from rig.analysis.settings import grid_knobs
from rig.analysis.tables import adaptive_configs, render_campaign_table, render_problems
from rig.contracts import CampaignRow, GoodputRow, LosslessResult, ServerRow

if TYPE_CHECKING:
    from rig.analysis.runs import PointInfo

MAX_MISMATCH_ROWS = 50  # the terminal shows this many; CSV and JSON carry all


def render_latency(rows: list[LatencyRow]) -> Table:
    """TTFT/TPOT/ITL/E2E (and open-loop) percentiles per point, in ms."""
    t = Table(title="Latency (ms; ITL percentiles are over tokens)", title_justify="left", header_style="bold")
    declared.add_columns(t, columns.LATENCY, fold=True, units=False)
    last = None
    for r in rows:
        if last is not None and r["point"] != last:
            t.add_section()
        cells = declared.cells(columns.LATENCY, r)
        if r["point"] == last:  # the point once per group of its metrics
            cells[0] = ""
        t.add_row(*cells)
        last = r["point"]
    return t


def render_acceptance(rows: Sequence[Mapping[str, Any]]) -> Table:
    """Acceptance length per point, with every source side by side."""
    t = Table(
        title="Acceptance length (tokens per verify step)",
        title_justify="left",
        header_style="bold",
        caption="Per-request: rig's, Σ completion tokens / Σ verifies (counts each request's prefill token); "
        "Decode-only: Σ (tokens - 1) / Σ verifies, the figure SGLang's bench_serving prints",
        caption_justify="left",
    )
    return declared.fill(t, columns.ACCEPTANCE, rows, fold=True, units=False)


def render_server(rows: list[ServerRow]) -> Table:
    """The server's time series summarised next to the client's throughput."""
    t = Table(
        title="Server vs client (running/queued requests and KV token usage from /metrics)",
        title_justify="left",
        header_style="bold",
    )
    return declared.fill(t, columns.SERVER, rows, fold=True, units=False)


def simulated(rows: list[CampaignRow]) -> bool:
    return any("simulated" in str(r.get("energy_source") or "") for r in rows)


def render_energy(report: Report) -> Table:
    """Energy and cost per point (rig.analysis.energy): from the GPU counters over each point's window."""
    rows = report.campaign
    sim = " — SIMULATED: the simulator's power model, not a measurement" if simulated(rows) else ""
    t = Table(
        title=f"Energy and cost per point (energy over the point's window, all GPUs){sim}",
        title_justify="left",
        header_style="bold",
        title_style="bold yellow" if sim else None,
    )
    energy_columns = (
        columns.ENERGY_IDENTITY + (columns.ENERGY if report.energy else []) + (columns.COST if report.cost else [])
    )
    return declared.fill(t, energy_columns, rows, fold=True)


def render_schedule(report: Report) -> list[RenderableType]:
    """Per workload: the best setting in each load band with its CI, the crossovers, and each setting at its SLO
    limit."""
    from rig.analysis.slo import describe

    out: list[RenderableType] = []
    among = f"points meeting {describe(report.slos, report.slo_percentile)}" if report.slos else "valid points"
    sim = simulated(report.campaign)
    for s in report.schedule:
        obj = columns.OBJECTIVE_TEXT.get(s["objective"], s["objective"])
        t = Table(
            title=f"Speculative schedule by load · {s['workload']} ({s['load_mode']}): best by {obj} among "
            f"{among}; margin over the runner-up, 95% CI",
            title_justify="left",
            header_style="bold",
        )
        declared.fill(t, columns.schedule_bands(s["objective"]), s["bands"])
        out.append(t)
        if s["crossovers"]:
            out.append(
                Text(
                    "Crossovers: "
                    + "; ".join(
                        f"{c['from']} up to {c['from_level']:g}, {c['to']} from {c['to_level']:g}"
                        + (
                            f" (incomplete: no valid point of {', '.join(c['incomplete'] or [])})"
                            if c.get("incomplete")
                            else ""
                            if c["decided"]
                            else " (not decided: CI spans 0)"
                        )
                        for c in s["crossovers"]
                    )
                )
            )
        else:
            out.append(Text("Crossovers: none (one setting is best in every band)", style="dim"))
        where = "the highest load meeting the SLOs" if report.slos else "its highest valid load (no --slo given)"
        lim = Table(
            title=f"Each setting at {where} · {s['workload']}" + (" — energy SIMULATED" if sim else ""),
            title_justify="left",
            header_style="bold",
        )
        declared.fill(lim, columns.schedule_limits(bool(report.energy), bool(report.cost)), s["at_slo_limit"])
        out.append(lim)
    return out


def render_goodput(rows: list[GoodputRow]) -> Table:
    """Requests meeting every SLO per point."""
    slos = rows[0]["slos"] if rows else ""
    t = Table(title=f"Goodput ({slos})", title_justify="left", header_style="bold")
    return declared.fill(t, columns.GOODPUT, rows, fold=True, units=False)


def render_lossless(result: LosslessResult) -> RenderableType:
    """A one-line verdict, and the mismatching requests if any."""
    if result.groups_checked == 0:
        return Text(
            "Greedy losslessness: nothing to compare (no two points share requests across speculative settings)",
            style="dim",
        )
    if result.requests_checked == 0:  # no mismatch because nothing was compared: not an OK
        return Text(f"Greedy losslessness: not checked ({not_checked_reason(result)})", style="yellow")
    if result.ok:
        return Text(
            f"Greedy losslessness: OK ({result.requests_checked:,} temperature-0 requests compared across "
            f"{result.groups_checked} group(s) of points)",
            style="green",
        )
    rows = mismatch_rows(result)
    t = Table(
        title=f"Greedy losslessness: {len(rows)} MISMATCH(ES)",
        title_justify="left",
        title_style="bold red",
        header_style="bold",
    )
    for c in ("Request", "Workload", "Level", "Repeat", "Steps", "Output hashes"):
        t.add_column(c)
    for r in rows[:MAX_MISMATCH_ROWS]:
        level = r["concurrency"] if r["concurrency"] is not None else r["rate"]
        t.add_row(r["request_id"], str(r["workload"]), str(level), str(r["repeat"]), r["steps"], r["hashes"])
    if len(rows) > MAX_MISMATCH_ROWS:
        t.caption = f"… and {len(rows) - MAX_MISMATCH_ROWS} more (see --csv / --json)"
    return t


def decision_tables(report: Report) -> list[RenderableType]:
    """Frontier, best per level and per SLO, and the run's SLO search / tune / prove results."""
    from rig.analysis.adaptive import best_level_table, best_slo_table, frontier_table, search_table, tune_tables
    from rig.analysis.slo import describe

    out: list[RenderableType] = []
    if report.frontier:
        out.append(frontier_table(report.frontier))
    if report.best_per_level:
        out.append(
            best_level_table(
                report.best_per_level, describe(report.slos, report.slo_percentile) if report.slos else None
            )
        )
    if report.best_per_slo:
        out.append(best_slo_table(report.best_per_slo))
    if report.search:
        out.append(search_table(report.search))
    if report.tune:
        out += tune_tables(report.tune)
    if report.prove:
        from rig.analysis.prove import prove_table

        out.append(prove_table(report.prove))
    return out


def seeds_line(points: list[PointInfo]) -> str:
    """Whether the servers of the run honoured per-request sampling seeds (from the manifest's effective config)."""
    seen = {p.seeds_honoured for p in points}
    if seen == {True}:
        return "honoured by the server (sampled requests are reproducible across points)"
    if seen == {False}:
        return "not honoured by the server (SGLang without --enable-deterministic-inference)"
    if seen == {None}:
        return "unknown (the server does not say)"
    return "honoured by some server configurations only"


def render_verdict(report: Report) -> RenderableType:
    """The answer first: the run's health, then per workload the best setting in each load band and the crossovers,
    and the figure behind them."""
    from rig.analysis.verdict import figure_name, health_text, verdict, workload_lines

    v = verdict(report)
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    style = "green" if v.health.good else "yellow"
    for i, line in enumerate(health_text(v.health)):
        grid.add_row("health" if i == 0 else "", Text(line, style=style))
    for w in v.workloads:
        head, lines = workload_lines(w)
        grid.add_row(w.workload, Text(head, style="bold"))
        for line in lines:
            grid.add_row("", Text("  " + line))
        grid.add_row(
            "", Text(f"  figure: {figure_name(w.workload, w.load_mode)}.png (--plots DIR), or --html FILE", style="dim")
        )
    return Panel(grid, title="Verdict", title_align="left", expand=False)


def render_report(report: Report) -> Group:
    """Every section of the report for the terminal: the verdict first."""
    parts: list[RenderableType] = [
        Text(
            f"Run {report.run.run_id}  ·  status {report.run.status or 'unknown'}  ·  {len(report.campaign)} point(s)",
            style="bold",
        ),
        render_verdict(report),
    ]
    for w in report.warnings:
        parts.append(Text(f"! {w}", style="yellow"))
    parts.append(Text(f"Per-request seeds: {seeds_line(report.run.points)}"))
    for line in report.telemetry:
        parts.append(Text(line, style="yellow" if "SIMULATED" in line or "absent" in line else ""))
    parts.append(render_campaign_table(report.campaign, grid_knobs(report.run), adaptive_configs(report.run)))
    problems = render_problems(report.campaign)
    if problems is not None:
        parts.append(problems)
    parts += [render_latency(report.latency), render_acceptance(report.acceptance), render_server(report.server)]
    if report.energy or report.cost:
        parts.append(render_energy(report))
    if report.goodput:
        parts.append(render_goodput(report.goodput))
    parts += decision_tables(report)
    parts += render_schedule(report)
    if report.timelines:
        from rig.analysis.timeline_render import render_timelines

        parts += render_timelines(report.timelines)
    from rig.analysis.render_adaptive import active_steps_tables, engine_schedule_parts

    parts += engine_schedule_parts(report)
    parts += active_steps_tables(report)
    parts.append(render_lossless(report.lossless))
    return Group(*parts)
