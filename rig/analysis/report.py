"""The whole report of a run: every section computed in one pass over the points, ready to render or export."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rig.analysis import metrics as m
from rig.analysis.active_steps import ActiveStepsRow, active_steps, worth_showing
from rig.analysis.engine_schedule import EngineSchedule, engine_schedules
from rig.analysis.lossless import mismatch_rows
from rig.analysis.percentiles import cdf_points, latency_rows
from rig.analysis.points import INVALIDATING, campaign_row, sort_key
from rig.analysis.reader import Reader
from rig.analysis.rows import AcceptanceRow, FrontierRow, FullReport, LatencyRow, ReportLevelBest, ScheduleGroup
from rig.analysis.runs import PointInfo, Run, load_run
from rig.analysis.server_series import Series, counter_window_acceptance, summarize_point
from rig.analysis.timeline import DEFAULT_WINDOW_S, Timeline
from rig.contracts import (
    CampaignRow,
    GoodputRow,
    LosslessResult,
    Manifest,
    ProveSection,
    Row,
    SearchSection,
    ServerRow,
    TuneSection,
)


@dataclass
class Report:
    """Every table of ``rig report`` plus the data its plots need."""

    run: Run
    campaign: list[CampaignRow]
    latency: list[LatencyRow]
    acceptance: list[AcceptanceRow]
    server: list[ServerRow]
    goodput: list[GoodputRow]
    lossless: LosslessResult
    slos: list[m.Slo] = field(default_factory=list)
    slo_percentile: float = 99.0
    frontier: list[FrontierRow] = field(default_factory=list)  # Pareto points (rows also carry on_frontier)
    best_per_level: list[ReportLevelBest] = field(default_factory=list)
    best_per_slo: list[dict[str, Any]] = field(default_factory=list)
    search: SearchSection | None = None  # the manifest's SLO search section (rig sweep --search)
    tune: TuneSection | None = None  # the manifest's tune section (rig tune)
    prove: ProveSection | None = None  # the manifest's prove section (rig prove: its bands or phases, its verdict)
    series: dict[str, dict[str, Series]] = field(default_factory=dict)
    cdfs: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    energy: bool = False  # campaign rows carry energy figures (the run has GPU telemetry)
    cost: bool = False  # campaign rows carry $/Mtok (a GPU-hour price was given or recorded)
    telemetry: list[str] = field(default_factory=list)  # per server configuration: GPU figures' source or absence
    objective: str = "throughput"
    schedule: list[ScheduleGroup] = field(default_factory=list)  # rig.analysis.schedule
    timelines: list[Timeline] = field(default_factory=list)  # points that ran a load profile (rig.analysis.timeline)
    active_steps: list[ActiveStepsRow] = field(default_factory=list)  # points whose server published its steps
    engine_schedule: list[EngineSchedule] = field(default_factory=list)  # rig.analysis.engine_schedule

    @property
    def warnings(self) -> list[str]:
        """Run-level caveats: run status, points without rows, invalid points."""
        out = list(self.run.warnings)
        empty = [r.point for r in self.campaign if r.requests == 0]
        if empty:
            out.append(f"{len(empty)} point(s) have no rows: {', '.join(empty)}")
        bad = [r.point for r in self.campaign if set(r.flags) & INVALIDATING]
        if bad:
            out.append(f"{len(bad)} point(s) flagged invalid: {', '.join(bad)}")
        if not self.lossless.ok:
            out.append(f"greedy losslessness: {len(self.lossless.mismatches)} mismatching request(s)")
        return out


def adaptive_slos(manifest: Manifest) -> tuple[list[m.Slo], float | None]:
    """The SLOs and percentile an SLO search or tune run was made for (none for a grid sweep)."""
    for section in (manifest.search, manifest.tune):
        settings = section.settings if section is not None else None
        if settings is not None and settings.slos:
            try:
                return [m.parse_slo(t) for t in settings.slos], float(settings.percentile)
            except (ValueError, TypeError):
                return [], None
    return [], None


@dataclass
class _Sections:
    """The per-point sections as they are read, in run order (sorted into report order at the end)."""

    campaign: list[CampaignRow] = field(default_factory=list)
    latency: list[LatencyRow] = field(default_factory=list)
    acceptance: list[AcceptanceRow] = field(default_factory=list)
    server: list[ServerRow] = field(default_factory=list)
    goodput: list[GoodputRow] = field(default_factory=list)
    series: dict[str, dict[str, Series]] = field(default_factory=dict)
    cdfs: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    meets: dict[str, bool] = field(default_factory=dict)  # point -> meets every SLO (only with SLOs)
    active_steps: list[ActiveStepsRow] = field(default_factory=list)


@dataclass
class _SloTerms:
    """What the SLO verdicts are judged by: the SLOs, their percentile, how cancelled requests count."""

    slos: list[m.Slo]
    percentile: float
    cancelled: str


def build_report(
    run_dir: Path | str | Run,
    slos: list[m.Slo] | None = None,
    cdf_resolution: int = 200,
    slo_percentile: float | None = None,
    thresholds: str | None = None,
    gpu_hour_price: float | None = None,
    objective: str = "throughput",
    slo_cancelled: str = "excluded",
    timeline_window_s: float = DEFAULT_WINDOW_S,
) -> Report:
    """Read each point once and compute every section of the report (SLOs: the given ones, else those of the
    run's SLO search or tune; ``thresholds``: judge validity again, see rig.analysis.runs.load_run; the price per
    GPU-hour: the given one, else the run's cluster file's; ``objective``: what the speculative schedule ranks by,
    rig.analysis.schedule.OBJECTIVES; ``cdf_resolution``: quantiles per latency CDF for the
    plots, 0 for none; ``timeline_window_s``: the windows of a load profile's timeline)."""
    from rig.analysis.energy import recorded_price
    from rig.analysis.timeline_data import run_timelines

    run = run_dir if isinstance(run_dir, Run) else load_run(run_dir, thresholds)
    terms = _slo_terms(run, slos, slo_percentile, slo_cancelled)
    reader = Reader(run)
    sections = _read_points(run, reader, terms, cdf_resolution)
    price = gpu_hour_price if gpu_hour_price is not None else recorded_price(run)
    energy, telemetry = _mark_frontier_and_energy(run, sections.campaign, price, objective)
    decided = _decisions(run, reader, sections, terms, objective)
    engine = engine_schedules(run, decided.schedule, sections.campaign, sections.series)
    return Report(
        run=run,
        campaign=_in_report_order(sections.campaign, sections.campaign),
        latency=_in_report_order(sections.latency, sections.campaign),
        acceptance=_in_report_order(sections.acceptance, sections.campaign),
        server=_in_report_order(sections.server, sections.campaign),
        goodput=_in_report_order(sections.goodput, sections.campaign),
        lossless=reader.lossless(),
        slos=terms.slos,
        slo_percentile=terms.percentile,
        frontier=_frontier_rows(sections.campaign),
        best_per_level=decided.best_per_level,
        best_per_slo=decided.best_per_slo,
        search=run.manifest.search,
        tune=run.manifest.tune,
        prove=run.manifest.prove,
        series=sections.series,
        cdfs=sections.cdfs,
        energy=energy,
        cost=price is not None,
        telemetry=telemetry,
        objective=objective,
        schedule=decided.schedule,
        timelines=run_timelines(run, timeline_window_s),
        active_steps=_in_report_order(sections.active_steps, sections.campaign),
        engine_schedule=engine,
    )


def _slo_terms(run: Run, slos: list[m.Slo] | None, percentile: float | None, cancelled: str) -> _SloTerms:
    """The given SLOs and percentile, else those the run's SLO search or tune was made for."""
    from rig.analysis.slo import DEFAULT_PERCENTILE

    chosen = list(slos or [])
    if not chosen:
        chosen, recorded = adaptive_slos(run.manifest)
        percentile = percentile or recorded
    return _SloTerms(chosen, percentile or DEFAULT_PERCENTILE, cancelled)


def _read_points(run: Run, reader: Reader, terms: _SloTerms, cdf_resolution: int) -> _Sections:
    """Every per-point section, each point read once (the reader reads ahead)."""
    out = _Sections()
    for p in run.points:
        r, series, itl = reader.next(p)
        out.series[p.point] = series
        row = campaign_row(run, p, r, series)
        out.latency += latency_rows(p, r, itl)
        if cdf_resolution:  # only plots draw them (0: the terminal, JSON and CSV need none)
            out.cdfs[p.point] = _cdfs(r, itl, cdf_resolution)
        out.acceptance.append(_acceptance_row(p, row, r, series))
        out.server.append(_server_row(run, p, row, series))
        table = run.server_config(p.server_config).adaptive
        steps = active_steps(p.point, p.engine, p.steps, table.describe() if table else None, series)
        if steps is not None:
            out.active_steps.append(steps)
        if terms.slos:
            out.goodput.append(_goodput_row(p, row, r, terms.slos))
            out.meets[p.point] = _judge_slos(row, r, terms)
        out.campaign.append(row)
    return out


def _cdfs(r: m.Requests, itl: tuple[np.ndarray, np.ndarray], n: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The point's TTFT, TPOT, ITL and E2E CDFs at ``n`` quantiles (successful requests)."""
    ok = r.ok
    return {
        "ttft": cdf_points(r.ttft[ok], n=n),
        "tpot": cdf_points(r.tpot[ok], n=n),
        "itl": cdf_points(*itl, n=n),
        "e2e": cdf_points(r.e2e[ok], n=n),
    }


def _acceptance_row(p: PointInfo, row: CampaignRow, r: m.Requests, series: dict[str, Series]) -> AcceptanceRow:
    """The point's acceptance length from every source side by side."""
    wa = p.window_acceptance.accept_length if p.window_acceptance is not None else None
    gauge = series["accept_length_gauge"]
    return {
        "point": p.point,
        "steps": p.steps,
        "workload": p.workload,
        "level": p.level,
        "accept_length": row.accept_length,
        "source": row.accept_source,
        "from_requests": m.acceptance_from_requests(r),
        "decode_only": m.acceptance_decode_only(r),
        "from_manifest_window": float(wa) if wa is not None else None,
        "from_server_counters": counter_window_acceptance(p.engine, series),
        "server_gauge_mean": m.nanmean(gauge.values) if not gauge.empty else None,
    }


def _server_row(run: Run, p: PointInfo, row: CampaignRow, series: dict[str, Series]) -> ServerRow:
    """The server's series summarised, next to the client's throughput of the same point."""
    srv = summarize_point(run, p, series)
    srv.steps, srv.workload, srv.level = p.steps, p.workload, p.level
    srv.aggregate_tok_s, srv.per_request_tok_s, srv.decode_tok_s = (
        row.aggregate_tok_s,
        row.per_request_tok_s,
        row.decode_tok_s,
    )
    return srv


def _goodput_row(p: PointInfo, row: CampaignRow, r: m.Requests, slos: list[m.Slo]) -> GoodputRow:
    """The point's goodput under the SLOs, also written onto its campaign row."""
    g = m.goodput(r, slos, row.wall_s)
    g.point, g.steps, g.workload, g.level = p.point, p.steps, p.workload, p.level
    row.goodput_fraction, row.goodput_req_s, row.goodput_tok_s = g.fraction, g.goodput_req_s, g.goodput_tok_s
    return g


def _judge_slos(row: CampaignRow, r: m.Requests, terms: _SloTerms) -> bool:
    """Whether the point meets every SLO at the percentile; the verdict is written onto its campaign row."""
    from rig.analysis.slo import evaluate_slos

    verdict = evaluate_slos(r, terms.slos, terms.percentile, terms.cancelled)
    row.slo_meets, row.slo_margin, row.slo_note = verdict.meets, verdict.margin, verdict.note
    return verdict.meets


def _mark_frontier_and_energy(
    run: Run, campaign: list[CampaignRow], price: float | None, objective: str
) -> tuple[bool, list[str]]:
    """Mark the Pareto points and add energy and cost to the campaign rows (in place); refuse an objective no point
    has a figure for. Returns whether energy was added and the telemetry lines."""
    from rig.analysis.energy import add_energy, telemetry_lines
    from rig.analysis.frontier import mark_frontier
    from rig.analysis.schedule import check_objective

    mark_frontier(run, campaign)
    energy = add_energy(run, campaign, price)
    telemetry = telemetry_lines(run)
    absent = next((line.split(": absent ", 1)[1] for line in telemetry if ": absent " in line), None)
    check_objective(campaign, objective, absent)
    return energy, telemetry


@dataclass
class _Decisions:
    """What the report decides: the best per level, per SLO (with SLOs), and the speculative schedule."""

    best_per_level: list[ReportLevelBest] = field(default_factory=list)
    best_per_slo: list[dict[str, Any]] = field(default_factory=list)  # rig.analysis.frontier.best_per_slo
    schedule: list[ScheduleGroup] = field(default_factory=list)  # rig.analysis.schedule.build_schedule


def _decisions(run: Run, reader: Reader, sections: _Sections, terms: _SloTerms, objective: str) -> _Decisions:
    """The best per level, the best per SLO and the speculative schedule. In a small run the last two are computed
    on a reader thread beside the first, while the other checks losslessness (each draws from its own seeded
    generator: the same numbers in any order)."""
    from rig.analysis.frontier import best_per_level, best_per_slo
    from rig.analysis.schedule import build_schedule
    from rig.analysis.slo import describe

    campaign, meets = sections.campaign, sections.meets if terms.slos else None

    def per_slo_and_schedule() -> _Decisions:
        slo_text = describe(terms.slos, terms.percentile, terms.cancelled)
        best_slo = best_per_slo(run, campaign, sections.meets, slo_text) if terms.slos else []
        return _Decisions(
            best_per_slo=best_slo, schedule=build_schedule(run, _in_report_order(campaign, campaign), meets, objective)
        )

    later = reader.beside(per_slo_and_schedule)
    best_level = best_per_level(run, campaign, meets)
    decided = later()
    decided.best_per_level = best_level
    return decided


def _in_report_order(rows: list[Any], campaign: list[CampaignRow]) -> list[Any]:
    """``rows`` (each with a point) in the campaign's sorted order (points the campaign lacks first)."""
    order = {r.point: i for i, r in enumerate(sorted(campaign, key=sort_key))}
    return sorted(rows, key=lambda x: order.get(x["point"], 0))


def _frontier_rows(campaign: list[CampaignRow]) -> list[FrontierRow]:
    from rig.analysis.frontier import frontier_rows

    return frontier_rows(campaign)


def _cell(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return ";".join(str(x) for x in v)
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return "" if v is None else v


def write_csv(rows: Sequence[Mapping[str, Any] | Row], path: Path) -> None:
    """Rows as CSV with the union of their keys as header (lists joined by ';')."""
    dicts = [r.to_dict() if isinstance(r, Row) else r for r in rows]
    keys: list[str] = []
    for r in dicts:
        keys += [k for k in r if k not in keys]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in dicts:
            w.writerow({k: _cell(r.get(k)) for k in keys})


def export_csv(report: Report, out_dir: Path) -> list[Path]:
    """campaign, latency, acceptance, server, goodput (with SLOs) and lossless mismatches as CSV files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tables: dict[str, Sequence[Mapping[str, Any] | Row]] = {
        "campaign": report.campaign,
        "latency": report.latency,
        "acceptance": report.acceptance,
        "server": report.server,
        "lossless_mismatches": mismatch_rows(report.lossless),
    }
    if report.slos:
        tables["goodput"] = report.goodput
        tables["best_per_slo"] = report.best_per_slo
    tables["frontier"] = report.frontier
    tables["best_per_level"] = report.best_per_level
    from rig.analysis.schedule import limit_rows, schedule_rows

    tables["schedule"] = schedule_rows(report.schedule)
    tables["schedule_at_slo_limit"] = limit_rows(report.schedule)
    from rig.analysis.engine_schedule import range_rows

    tables["engine_schedule"] = range_rows(report.engine_schedule)
    if worth_showing(report.active_steps):
        tables["active_steps"] = report.active_steps
    paths = []
    for name, rows in tables.items():
        path = out_dir / f"{name}.csv"
        write_csv(rows, path)
        paths.append(path)
    return paths


def full_json(report: Report) -> FullReport:
    """Every decision-level section of a report (``rig report --json-full``)."""
    out: FullReport = {
        "run_id": report.run.run_id,
        "status": report.run.status,
        "warnings": report.warnings,
        "slos": [str(s) for s in report.slos],
        "slo_percentile": report.slo_percentile if report.slos else None,
        "campaign": report.campaign,
        "frontier": report.frontier,
        "best_per_level": report.best_per_level,
        "best_per_slo": report.best_per_slo,
        "goodput": report.goodput,
        "search": report.search.model_dump(mode="json") if report.search else None,
        "tune": report.tune.model_dump(mode="json") if report.tune else None,
        "objective": report.objective,
        "schedule": report.schedule,
        "engine_schedule": report.engine_schedule,
    }
    if report.telemetry:
        out["telemetry"] = report.telemetry
    if report.prove:
        out["prove"] = report.prove.model_dump(mode="json")
    if report.timelines:
        out["timeline"] = [asdict(tl) for tl in report.timelines]
    if worth_showing(report.active_steps):
        out["active_steps"] = report.active_steps
    return out


def to_json(obj: Any) -> str:
    """JSON with NaN/inf as null (strict JSON readers reject NaN)."""

    def clean(x: Any) -> Any:
        if isinstance(x, float) and not np.isfinite(x):
            return None
        if isinstance(x, Row):
            return clean(x.to_dict())
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if isinstance(x, np.generic):
            return clean(x.item())
        return x

    return json.dumps(clean(obj), indent=2)
