"""The manifests' tables of ``rig query`` (points, server configurations, runs) as Arrow tables DuckDB scans."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from rig.analysis.runs import Run


def _json(x: Any) -> str | None:
    return None if x is None else json.dumps(x, sort_keys=True, default=str)


def points_table(runs: list[Run], names: list[str]) -> pa.Table:
    """The ``points`` table: the manifests' points as analysis sees them (rig.analysis.runs.PointInfo)."""
    rows = []
    for run, name in zip(runs, names, strict=False):
        for p in run.points:
            wa = p.window_acceptance
            rows.append(
                {
                    "run": name,
                    "point": p.point,
                    "server_config": p.server_config,
                    "engine": p.engine,
                    "workload": p.workload,
                    "steps": p.steps,
                    "load_mode": p.load_mode,
                    "concurrency": p.concurrency,
                    "rate": p.rate,
                    "repeat": p.repeat,
                    "status": p.status,
                    "error": p.error,
                    "flags": list(p.flags),
                    "started_ts": p.started_ts,
                    "ended_ts": p.ended_ts,
                    "requests_planned": p.requests_planned,
                    "requests_scheduled": p.requests_scheduled,
                    "window_accept_length": wa.accept_length if wa is not None else None,
                    "in_manifest": p.in_manifest,
                    "knobs": _json(p.knobs),
                }
            )
    schema = pa.schema(
        [
            ("run", pa.string()),
            ("point", pa.string()),
            ("server_config", pa.string()),
            ("engine", pa.string()),
            ("workload", pa.string()),
            ("steps", pa.int64()),
            ("load_mode", pa.string()),
            ("concurrency", pa.int64()),
            ("rate", pa.float64()),
            ("repeat", pa.int64()),
            ("status", pa.string()),
            ("error", pa.string()),
            ("flags", pa.list_(pa.string())),
            ("started_ts", pa.float64()),
            ("ended_ts", pa.float64()),
            ("requests_planned", pa.int64()),
            ("requests_scheduled", pa.int64()),
            ("window_accept_length", pa.float64()),
            ("in_manifest", pa.bool_()),
            ("knobs", pa.string()),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def server_configs_table(runs: list[Run], names: list[str]) -> pa.Table:
    """The ``server_configs`` table: one row per configuration of each manifest."""
    rows = []
    for run, name in zip(runs, names, strict=False):
        for cid, cfg in run.manifest.server_configs.items():
            rows.append(
                {
                    "run": name,
                    "server_config": cid,
                    "engine": cfg.engine,
                    "status": cfg.status,
                    "error": cfg.error,
                    "knobs": _json(cfg.knobs),
                    "effective": _json(cfg.effective.model_dump(mode="json") if cfg.effective is not None else None),
                    "server_info": _json(cfg.server_info),
                    "ready_after_s": cfg.ready_after_s,
                    "adaptive": _json(cfg.adaptive.model_dump(mode="json") if cfg.adaptive is not None else None),
                }
            )
    schema = pa.schema(
        [
            ("run", pa.string()),
            ("server_config", pa.string()),
            ("engine", pa.string()),
            ("status", pa.string()),
            ("error", pa.string()),
            ("knobs", pa.string()),
            ("effective", pa.string()),
            ("server_info", pa.string()),
            ("ready_after_s", pa.float64()),
            ("adaptive", pa.string()),  # SGLang --speculative-adaptive: its candidate table (JSON), else null
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def runs_table(runs: list[Run], names: list[str]) -> pa.Table:
    """The ``runs`` table: one row per run (its directory, status and points)."""
    return pa.table(
        {
            "run": names,
            "run_dir": [str(r.run_dir) for r in runs],
            "status": pa.array([r.status for r in runs], pa.string()),
            "points": pa.array([len(r.points) for r in runs], pa.int64()),
        }
    )
