"""The whole report of a run: every section computed in one pass over the points, ready to render or export."""

from __future__ import annotations

import csv
import json
import os
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rig.analysis import metrics as m
from rig.analysis.lossless import check_lossless, mismatch_rows
from rig.analysis.percentiles import cdf_points, latency_rows, read_itl
from rig.analysis.points import INVALIDATING, campaign_row, load_requests, sort_key
from rig.analysis.rows import FrontierRow, FullReport, LatencyRow, ReportLevelBest
from rig.analysis.runs import PointInfo, Run, load_run, point_files
from rig.analysis.server_series import Series, counter_window_acceptance, point_series, summarize_point
from rig.contracts import CampaignRow, GoodputRow, LosslessResult, Manifest, Row, SearchSection, ServerRow, TuneSection


@dataclass
class Report:
    """Every table of ``rig report`` plus the data its plots need."""

    run: Run
    campaign: list[CampaignRow]
    latency: list[LatencyRow]
    acceptance: list[dict[str, Any]]
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
    series: dict[str, dict[str, Series]] = field(default_factory=dict)
    cdfs: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    energy: bool = False  # campaign rows carry energy figures (the run has GPU telemetry)
    cost: bool = False  # campaign rows carry $/Mtok (a GPU-hour price was given or recorded)
    telemetry: list[str] = field(default_factory=list)  # per server configuration: GPU figures' source or absence
    objective: str = "throughput"
    schedule: list[dict[str, Any]] = field(default_factory=list)  # rig.analysis.schedule

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


def _hand_back_large_frees() -> None:
    """glibc keeps a freed block below its mmap threshold in the arena of the thread that freed it, and raises the
    threshold to the size of every large block freed (up to 32 MB): a large point's 16 MB arrays, made by two
    threads, would then hold two arenas' high-water marks. Fixing the threshold at 1 MiB maps every such array on
    its own and unmaps it when freed (glibc only; elsewhere nothing changes)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD (malloc.h)
    except (OSError, AttributeError):
        pass


class Reader:
    """Reads the report's points one or two ahead of the one being summarised, on two more threads (a point's metric
    columns and server series on one, its ITL lists on the other): Arrow's reads and numpy's array work release the
    GIL, so reading the next point overlaps with the percentiles of this one and both cores work (the report's
    arithmetic is unchanged: the same functions on the same arrays). Then the losslessness check, which needs no
    point's figures, runs beside the last points. Each task's warnings are added in the order a single pass would
    add them."""

    # Memory bounds: reading and deriving a point takes about 5x its part files' size on disk at its peak. Small
    # points are read two ahead and the losslessness check runs beside the last ones; large points (a 100 M-record
    # run's are 270 MB of files, 1.2 GB at the peak) are read one at a time, when asked for, and losslessness is
    # checked alone after them: the report's memory is that of its largest point, whatever the number of points.
    SMALL_POINT = 64 * 2**20  # bytes on disk
    SMALL_RUN = 2 * 2**30

    def __init__(self, run: Run) -> None:
        self.run = run
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="rig-report-reader")
        self.todo = list(run.points)
        self.ahead: deque[tuple[Future, Future]] = deque()
        self.check: Future | None = None
        sizes = [sum(os.path.getsize(f) for f in point_files(run.run_dir, p.point)) for p in run.points]
        self.depth = 2 if max(sizes, default=0) <= self.SMALL_POINT else 0
        if not self.depth:
            _hand_back_large_frees()
        self.overlap_check = sum(sizes) <= self.SMALL_RUN
        self._fill()

    def _deferred(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, list[str]]:
        with self.run.deferred_notes() as notes:
            return fn(*args), notes

    def _inputs(self, p: PointInfo) -> tuple[m.Requests, dict[str, Series]]:
        return load_requests(self.run, p), point_series(self.run, p.point)

    def _submit(self, p: PointInfo) -> tuple[Future, Future]:
        inputs = self.pool.submit(self._deferred, self._inputs, p)
        if not self.depth:  # a large point: its lists after its columns, on the same thread (the memory of one)
            return inputs, self.pool.submit(self._after, inputs, read_itl, self.run, p)
        return inputs, self.pool.submit(self._deferred, read_itl, self.run, p)

    def _after(self, first: Future, fn: Callable[..., Any], *args: Any) -> tuple[Any, list[str]]:
        first.exception()  # waits for it (its error, if any, is raised where it is taken)
        return self._deferred(fn, *args)

    def _fill(self) -> None:
        while self.todo and len(self.ahead) < self.depth:
            self.ahead.append(self._submit(self.todo.pop(0)))
        if not self.todo and self.check is None and self.overlap_check:
            self.check = self.pool.submit(self._deferred, check_lossless, self.run)

    def _take(self, future: Future) -> Any:
        try:
            got, notes = future.result()
        except BaseException:
            self.pool.shutdown(wait=True, cancel_futures=True)
            raise
        for n in notes:
            self.run.note(n)
        return got

    def next(self, p: PointInfo) -> tuple[m.Requests, dict[str, Series], tuple[np.ndarray, np.ndarray]]:
        """The requests, server series and ITL of ``p`` (the next point of run.points)."""
        if not self.ahead:  # large points: this one, now
            self.ahead.append(self._submit(self.todo.pop(0)))
        inputs, itl = self.ahead.popleft()
        (r, series), lists = self._take(inputs), self._take(itl)
        if not self.depth:  # large points: hand the last one's Arrow buffers back to the system (4 ms a call)
            pa.default_memory_pool().release_unused()
        self._fill()
        return r, series, lists

    def beside(self, fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
        """``fn(*args)`` on a reader thread, now, in a small run of small points (its warnings deferred), else when
        the returned callable is called (large points' sections one at a time: the memory of one); call it for the
        result."""
        if not (self.depth and self.overlap_check):
            return lambda: fn(*args)
        future = self.pool.submit(self._deferred, fn, *args)
        return lambda: self._take(future)

    def lossless(self) -> LosslessResult:
        """check_lossless(run), once every point was taken."""
        self.run.forget()  # the points' kept arrays: what follows reads again the few points it needs
        pa.default_memory_pool().release_unused()
        if self.check is None:  # a large run: now, with no point's arrays held
            self.check = self.pool.submit(self._deferred, check_lossless, self.run)
        got: LosslessResult = self._take(self.check)
        self.pool.shutdown(wait=True)
        return got


def build_report(
    run_dir: Path | str | Run,
    slos: list[m.Slo] | None = None,
    cdf_resolution: int = 200,
    slo_percentile: float | None = None,
    thresholds: str | None = None,
    gpu_hour_price: float | None = None,
    objective: str = "throughput",
    slo_cancelled: str = "excluded",
) -> Report:
    """Read each point once and compute every section of the report (SLOs: the given ones, else those of the
    run's SLO search or tune; ``thresholds``: judge validity again, see rig.analysis.runs.load_run; the price per
    GPU-hour: the given one, else the run's cluster file's; ``objective``: what the speculative schedule ranks by,
    rig.analysis.schedule.OBJECTIVES; ``cdf_resolution``: quantiles per latency CDF for the
    plots, 0 for none)."""
    from rig.analysis.energy import add_energy, recorded_price, telemetry_lines
    from rig.analysis.frontier import best_per_level, best_per_slo, frontier_rows, mark_frontier
    from rig.analysis.schedule import build_schedule, check_objective
    from rig.analysis.slo import DEFAULT_PERCENTILE, describe, evaluate_slos

    run = run_dir if isinstance(run_dir, Run) else load_run(run_dir, thresholds)
    slos = list(slos or [])
    if not slos:
        slos, recorded = adaptive_slos(run.manifest)
        slo_percentile = slo_percentile or recorded
    pct = slo_percentile or DEFAULT_PERCENTILE
    meets: dict[str, bool] = {}
    campaign, latency, accept_rows, server, good = [], [], [], [], []
    series_by_point, cdfs = {}, {}
    reader = Reader(run)
    for p in run.points:
        r, series, itl = reader.next(p)
        series_by_point[p.point] = series
        row = campaign_row(run, p, r, series)
        latency += latency_rows(p, r, itl)
        ok = r.ok
        if cdf_resolution:  # only plots draw them (0: the terminal, JSON and CSV need none)
            cdfs[p.point] = {
                "ttft": cdf_points(r.ttft[ok], n=cdf_resolution),
                "tpot": cdf_points(r.tpot[ok], n=cdf_resolution),
                "itl": cdf_points(*itl, n=cdf_resolution),
                "e2e": cdf_points(r.e2e[ok], n=cdf_resolution),
            }
        wa = p.window_acceptance.accept_length if p.window_acceptance is not None else None
        gauge = series["accept_length_gauge"]
        accept_rows.append(
            {
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
        )
        srv = summarize_point(run, p, series)
        srv.steps, srv.workload, srv.level = p.steps, p.workload, p.level
        srv.aggregate_tok_s, srv.per_request_tok_s, srv.decode_tok_s = (
            row.aggregate_tok_s,
            row.per_request_tok_s,
            row.decode_tok_s,
        )
        server.append(srv)
        if slos:
            g = m.goodput(r, slos, row.wall_s)
            g.point, g.steps, g.workload, g.level = p.point, p.steps, p.workload, p.level
            good.append(g)
            row.goodput_fraction, row.goodput_req_s, row.goodput_tok_s = g.fraction, g.goodput_req_s, g.goodput_tok_s
            verdict = evaluate_slos(r, slos, pct, slo_cancelled)
            row.slo_meets, row.slo_margin, row.slo_note = verdict.meets, verdict.margin, verdict.note
            meets[p.point] = verdict.meets
        campaign.append(row)
    order = {r.point: i for i, r in enumerate(sorted(campaign, key=sort_key))}
    by_order = lambda rows: sorted(rows, key=lambda x: order.get(x["point"], 0))  # noqa: E731
    mark_frontier(run, campaign)
    price = gpu_hour_price if gpu_hour_price is not None else recorded_price(run)
    energy = add_energy(run, campaign, price)
    telemetry = telemetry_lines(run)
    absent = next((line.split(": absent ", 1)[1] for line in telemetry if ": absent " in line), None)
    check_objective(campaign, objective, absent)
    # the intervals and the schedule are computed while a reader thread checks losslessness (beside the last
    # points, in a small run); in a small run the best per SLO and the schedule on the other reader thread, beside
    # the best per level (each draws from its own seeded generator: the same numbers in any order)

    def per_slo_and_schedule() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        best_slo = best_per_slo(run, campaign, meets, describe(slos, pct, slo_cancelled)) if slos else []
        return best_slo, build_schedule(run, by_order(campaign), meets if slos else None, objective)

    later = reader.beside(per_slo_and_schedule)
    best_level = best_per_level(run, campaign, meets if slos else None)
    best_slo, schedule = later()
    lossless = reader.lossless()
    return Report(
        run=run,
        campaign=by_order(campaign),
        latency=by_order(latency),
        acceptance=by_order(accept_rows),
        server=by_order(server),
        goodput=by_order(good),
        lossless=lossless,
        slos=slos,
        slo_percentile=pct,
        frontier=frontier_rows(campaign),
        best_per_level=best_level,
        best_per_slo=best_slo,
        search=run.manifest.search,
        tune=run.manifest.tune,
        series=series_by_point,
        cdfs=cdfs,
        energy=energy,
        cost=price is not None,
        telemetry=telemetry,
        objective=objective,
        schedule=schedule,
    )


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
    }
    if report.telemetry:
        out["telemetry"] = report.telemetry
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
