"""rig's Python API for notebooks and scripts: a run directory opened for analysis, its records as Arrow, pandas or
Polars frames, every report section as a frame, and paired comparisons.

    import rig
    run = rig.open_run("results/my-sweep")
    run.points                                   # typed manifest entries (rig.analysis.runs.PointInfo)
    df = run.requests_df(point=run.point_names[0], columns=["ttft_s", "e2e_s", "completion_tokens"])
    run.section("campaign")                      # any report section as a pandas DataFrame
    rig.compare(run, baseline_steps=0).frame("speedups")

Nothing is read until asked for: opening a run reads its manifest and lists its part files; ``requests`` reads only
the points and columns asked for; a report is built once per set of options and kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from rig.analysis import metrics as m
from rig.analysis.report import Report, build_report
from rig.analysis.rows import EnergyRatioRow, GateRow, LevelBest, SpeedupRow
from rig.analysis.runs import AnalysisInputError, PointInfo, Run, load_run, point_files, read_parts
from rig.analysis.verdict import Verdict, verdict
from rig.contracts import ArmResult, Manifest, ProveBand, Row
from rig.results import (
    GPU_METRICS_DIR,
    GPU_METRICS_SCHEMA,
    REQUEST_SCHEMA,
    REQUESTS_DIR,
    SERVER_METRICS_DIR,
    SERVER_METRICS_SCHEMA,
)

_KINDS = {
    "requests": (REQUESTS_DIR, REQUEST_SCHEMA),
    "server_metrics": (SERVER_METRICS_DIR, SERVER_METRICS_SCHEMA),
    "gpu_metrics": (GPU_METRICS_DIR, GPU_METRICS_SCHEMA),
}
SECTIONS = (
    "campaign",
    "latency",
    "acceptance",
    "server",
    "goodput",
    "frontier",
    "best_per_level",
    "best_per_slo",
    "schedule",
    "schedule_at_slo_limit",
    "engine_schedule",
    "active_steps",
    "lossless_mismatches",
    "verdict",
    "health",
    "timeline",  # a load profile's windows (one row per point and window)
    "timeline_phases",  # its phases: steady state and time to adapt
    "search",  # an SLO search (rig sweep --search): one row per configuration and workload searched
    "tune",  # rig tune: every probe, predicted against measured
    "tune_recommendation",  # rig tune's answer with its evidence (one row)
    "prove",  # rig prove: one row per load band (or phase) and arm, against the best static setting there
    "prove_schedule",  # rig prove's schedule arm: from this running batch up, these steps
    "cdfs",  # latency CDFs: one row per point, metric (ttft, tpot, itl, e2e) and quantile
)
CDF_RESOLUTION = 200  # quantiles per CDF for the cdfs section: what rig report's plots draw


def _polars() -> Any:
    try:
        import polars
    except ImportError:
        raise ImportError(
            "Polars is not installed (pip install polars); requests() and requests_df() need none"
        ) from None
    return polars


def _frame(rows: Iterable[Row | dict[str, Any]], columns: Iterable[str] = ()) -> pd.DataFrame:
    """Rows as a DataFrame; with none, an empty frame with ``columns`` (where the section knows them)."""
    dicts = [r.to_dict() if isinstance(r, Row) else dict(r) for r in rows]
    return pd.DataFrame(dicts) if dicts else pd.DataFrame(columns=list(columns))


class RunView:
    """A run directory opened for analysis (``rig.open_run``): the manifest, the points, the records and every
    section of ``rig report``."""

    def __init__(self, path: Path | str, thresholds: str | None = None) -> None:
        self.path = Path(path)
        self.thresholds = thresholds
        self.run: Run = load_run(self.path, thresholds)
        self._reports: dict[tuple[Any, ...], Report] = {}

    def __repr__(self) -> str:
        return f"RunView({str(self.path)!r}: {self.run_id}, {self.status}, {len(self.points)} point(s))"

    # ---------------------------------------------------------------- the manifest
    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def status(self) -> str | None:
        return self.run.status

    @property
    def manifest(self) -> Manifest:
        """The run's manifest (rig.contracts.Manifest: spec, versions, cluster, server configurations, points)."""
        return self.run.manifest

    @property
    def points(self) -> list[PointInfo]:
        """Every point: its manifest entry, the server knobs it ran, and what analysis found on disk."""
        return self.run.points

    @property
    def point_names(self) -> list[str]:
        return [p.point for p in self.run.points]

    def point(self, name: str) -> PointInfo:
        return self.run.point(name)

    @property
    def warnings(self) -> list[str]:
        return list(self.run.warnings)

    def points_df(self) -> pd.DataFrame:
        """One row per point: identity, status, flags, counts (the manifest's entries, flattened one level)."""
        return pd.DataFrame(
            [p.model_dump(exclude={"generators", "knobs"}) | {"knobs": p.knobs} for p in self.run.points]
        )

    # ---------------------------------------------------------------- records
    def _files(self, kind: str, point: str | Sequence[str] | None) -> list[str]:
        if kind not in _KINDS:
            raise ValueError(f"unknown record kind {kind!r} (one of {', '.join(_KINDS)})")
        names = [point] if isinstance(point, str) else list(point) if point is not None else self.point_names
        for n in names:
            self.run.point(n)  # an unknown point: one line naming the points there are
        return [f for n in names for f in point_files(self.path, n, _KINDS[kind][0])]

    def dataset(self, kind: str = "requests", point: str | Sequence[str] | None = None) -> ds.Dataset:
        """The part files of ``kind`` (requests, server_metrics, gpu_metrics) of the given point(s), as a lazy
        pyarrow dataset: filters and column selections are pushed into the scan."""
        return ds.dataset(self._files(kind, point), schema=_KINDS[kind][1], format="parquet")

    def requests(
        self,
        point: str | Sequence[str] | None = None,
        columns: Sequence[str] | None = None,
        filter: ds.Expression | None = None,
    ) -> pa.Table:
        """One row per request (rig.contracts.RequestRecord's columns) of the given point(s), all by default; a
        part file that cannot be read is left out and named in ``warnings``."""
        return read_parts(self._files("requests", point), REQUEST_SCHEMA, columns, filter, self.run.note)

    def requests_df(
        self, point: str | Sequence[str] | None = None, columns: Sequence[str] | None = None
    ) -> pd.DataFrame:
        """``requests`` as a pandas DataFrame."""
        return self.requests(point, columns).to_pandas()

    def requests_pl(self, point: str | Sequence[str] | None = None, lazy: bool = True) -> Any:
        """``requests`` as a Polars LazyFrame (``lazy=False``: a DataFrame); needs Polars installed."""
        pl = _polars()
        frame = pl.scan_pyarrow_dataset(self.dataset("requests", point))
        return frame if lazy else frame.collect()

    def server_metrics(self, point: str | Sequence[str] | None = None, names: Sequence[str] | None = None) -> pa.Table:
        """The server's /metrics samples (ts, name, labels, value) of the given point(s), optionally some names."""
        flt = ds.field("name").isin(list(names)) if names is not None else None
        return read_parts(self._files("server_metrics", point), SERVER_METRICS_SCHEMA, None, flt, self.run.note)

    def server_series(self, point: str) -> pd.DataFrame:
        """The report's view of the server over one point: running, queued, token usage, throughput and acceptance
        gauges and the counters, one row per (quantity, scrape time)."""
        from rig.analysis.server_series import point_series

        series = point_series(self.run, self.run.point(point).point)
        return pd.DataFrame(
            [
                {"quantity": name, "ts": float(t), "value": float(v)}
                for name, s in series.items()
                for t, v in zip(s.ts, s.values, strict=True)
            ],
            columns=["quantity", "ts", "value"],
        )

    def gpu_metrics(self, point: str | Sequence[str] | None = None) -> pa.Table:
        """GPU samples (power, energy counter, utilisation, memory, clocks) of the given point(s); empty without."""
        return read_parts(self._files("gpu_metrics", point), GPU_METRICS_SCHEMA, None, None, self.run.note)

    # ---------------------------------------------------------------- the report
    def report(
        self,
        slos: Sequence[str] = (),
        slo_percentile: float | None = None,
        objective: str = "throughput",
        gpu_hour_price: float | None = None,
        cdf_resolution: int = 0,
    ) -> Report:
        """The whole report (as ``rig report`` computes it), built once per set of options. ``slos``: e.g.
        ["ttft=500ms", "tpot=50ms"]; ``cdf_resolution``: quantiles per latency CDF (``Report.cdfs``), 0 for none."""
        key = (tuple(slos), slo_percentile, objective, gpu_hour_price, cdf_resolution)
        if key not in self._reports:
            self._reports[key] = build_report(
                self.run,
                slos=[m.parse_slo(s) for s in slos],
                slo_percentile=slo_percentile,
                gpu_hour_price=gpu_hour_price,
                objective=objective,
                cdf_resolution=cdf_resolution,
            )
        return self._reports[key]

    def verdict(self, **report_options: Any) -> Verdict:
        """The report's opening verdict: health, best setting per load band, crossovers."""
        return verdict(self.report(**report_options))

    def section(self, name: str, **report_options: Any) -> pd.DataFrame:
        """One section of the report as a DataFrame: one of SECTIONS (report options as for ``report``). A section
        the run does not have (no SLOs, no search, tune or prove) is an empty frame."""
        if name not in SECTIONS:
            raise ValueError(f"unknown section {name!r} (one of {', '.join(SECTIONS)})")
        if name == "cdfs":
            options = {"cdf_resolution": CDF_RESOLUTION, **report_options}
            if options["cdf_resolution"] <= 0:
                raise ValueError("the cdfs section needs cdf_resolution > 0 (quantiles per CDF)")
            return _cdf_frame(self.report(**options))
        rep = self.report(**report_options)
        if name in _RECORDED:
            return _RECORDED[name](rep)
        return _frame(_section_rows(rep, name))


def _section_rows(rep: Report, name: str) -> list[Any]:
    from rig.analysis.lossless import mismatch_rows
    from rig.analysis.schedule import limit_rows, schedule_rows

    if name == "schedule":
        return schedule_rows(rep.schedule)
    if name == "schedule_at_slo_limit":
        return limit_rows(rep.schedule)
    if name == "engine_schedule":
        from rig.analysis.engine_schedule import range_rows

        return range_rows(rep.engine_schedule)
    if name == "lossless_mismatches":
        return mismatch_rows(rep.lossless)
    if name == "verdict":
        return [
            {"workload": w.workload, "load_mode": w.load_mode, "objective": w.objective, **vars(b)}
            for w in verdict(rep).workloads
            for b in w.bands
        ]
    if name == "health":
        return [verdict(rep).health.to_dict()]
    if name in ("timeline", "timeline_phases"):
        from dataclasses import asdict

        return [
            {"point": tl.point, **asdict(x)}
            for tl in rep.timelines
            for x in (tl.windows if name == "timeline" else tl.phases)
        ]
    rows: list[Any] = getattr(rep, name)
    return rows


def _search_frame(rep: Report) -> pd.DataFrame:
    """The SLO search as its table shows it: per configuration and workload, the bracket and its margins."""
    from rig.analysis.adaptive import search_rows
    from rig.analysis.rows import SearchRow

    rows = [dict(r) for r in search_rows(rep.search)] if rep.search else []
    return _frame(rows, SearchRow.__annotations__)


def _tune_frame(rep: Report) -> pd.DataFrame:
    """Every probe of a tune, numbered, its prediction beside its measurement, and the verdict."""
    from rig.analysis.adaptive import tune_rows
    from rig.contracts import TuneProbe

    rows = [{"n": r.n, **r.probe.model_dump(), "verdict": r.verdict} for r in tune_rows(rep.tune)] if rep.tune else []
    return _frame(rows, ["n", *TuneProbe.model_fields, "verdict"])


def _recommendation_frame(rep: Report) -> pd.DataFrame:
    from rig.contracts import Recommendation

    rec = rep.tune.recommendation if rep.tune else None
    return _frame([rec.model_dump()] if rec else [], Recommendation.model_fields)


def _arm_rows(band: ProveBand) -> list[dict[str, Any]]:
    """One row per arm judged at the band; a band no arm reached keeps its best static setting (arm None)."""
    head = band.model_dump(exclude={"arms"})
    arms = list(band.arms.items())
    if not arms:
        return [{**head, "arm": None, **ArmResult().model_dump()}]
    return [{**head, "arm": label, **r.model_dump()} for label, r in arms]


def _prove_frame(rep: Report) -> pd.DataFrame:
    """rig prove's bands (a proof across load changes: its phases, then the whole profile) by arm."""
    bands = [*rep.prove.bands, *rep.prove.phases] if rep.prove else []
    columns = [*(k for k in ProveBand.model_fields if k != "arms"), "arm", *ArmResult.model_fields]
    return _frame([row for b in bands for row in _arm_rows(b)], columns)


def _prove_schedule_frame(rep: Report) -> pd.DataFrame:
    from rig.contracts import ScheduleSlot

    slots = rep.prove.schedule if rep.prove else []
    return _frame([s.model_dump() for s in slots], ScheduleSlot.model_fields)


def _cdf_frame(rep: Report) -> pd.DataFrame:
    """The latency CDFs the report's plots draw: per point and metric, each quantile's value (seconds)."""
    import numpy as np

    parts = [
        pd.DataFrame({"point": point, "metric": metric, "value_s": x, "fraction": f})
        for point, per in rep.cdfs.items()
        for metric, (x, f) in per.items()
        if np.size(x)
    ]
    columns = ["point", "metric", "value_s", "fraction"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


# the sections read from the manifest's adaptive-run records (rig sweep --search, rig tune, rig prove)
_RECORDED = {
    "search": _search_frame,
    "tune": _tune_frame,
    "tune_recommendation": _recommendation_frame,
    "prove": _prove_frame,
    "prove_schedule": _prove_schedule_frame,
}


def open_run(path: Path | str, thresholds: str | None = None) -> RunView:
    """Open a run directory for analysis (``thresholds``: judge validity again, as ``rig report --thresholds``)."""
    return RunView(path, thresholds)


@dataclass
class Comparison:
    """The paired result of ``rig.compare`` (what ``rig compare --json`` prints): per-request speedups with bootstrap
    CIs, the best configuration per level, energy ratios and gate verdicts where asked, and warnings."""

    mode: str
    resamples: int
    seed: int
    speedups: list[SpeedupRow]
    best: list[LevelBest]
    energy: list[EnergyRatioRow] = field(default_factory=list)
    gate: list[GateRow] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """A gate threshold is exceeded with 95 % confidence (``max_regression``)."""
        return any(g["verdict"] == "fail" for g in self.gate)

    def frame(self, name: str = "speedups") -> pd.DataFrame:
        """speedups, best, energy or gate as a DataFrame."""
        if name not in ("speedups", "best", "energy", "gate"):
            raise ValueError(f"unknown table {name!r} (speedups, best, energy, gate)")
        return pd.DataFrame(getattr(self, name))


def _target(x: RunView | Path | str) -> str:
    return str(x.path) if isinstance(x, RunView) else str(x)


def compare(
    a: RunView | Path | str,
    b: RunView | Path | str | None = None,
    baseline_steps: int | None = None,
    resamples: int = 2000,
    seed: int = 0,
    gpu_hour_price: float | None = None,
    max_regression: Sequence[str] = (),
    allow_incomplete: bool = False,
) -> Comparison:
    """Pair requests by id and compare (as ``rig compare``): two runs, two points ("RUN_DIR:POINT"), or one run's
    points against its ``baseline_steps`` point. ``max_regression``: gate thresholds, e.g. ["tpot_p99=3%"];
    ``allow_incomplete``: waive the gate's checks of what it cannot vouch for (as ``--allow-incomplete``)."""
    from rig.analysis.compare import compare as run_compare
    from rig.analysis.gate import parse_threshold

    gate = [parse_threshold(t) for t in max_regression]
    got = run_compare(
        _target(a),
        _target(b) if b is not None else None,
        baseline_steps,
        resamples,
        seed,
        gpu_hour_price,
        gate,
        allow_incomplete,
    )
    return Comparison(
        mode=got["mode"],
        resamples=got["resamples"],
        seed=got["seed"],
        speedups=got["speedups"],
        best=got["best"],
        energy=got.get("energy", []),
        gate=got.get("gate", []),
        warnings=got["warnings"],
    )


__all__ = ["SECTIONS", "AnalysisInputError", "Comparison", "RunView", "compare", "open_run"]
