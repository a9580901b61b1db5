"""Per-point numbers: read a point's records once and derive its campaign row, acceptance and validity flags."""

from __future__ import annotations

from typing import Any

import numpy as np

from rig.analysis import metrics as m
from rig.analysis.runs import PointInfo, Run, generator_offsets, read_point_requests
from rig.analysis.server_series import Series, counter_window_acceptance, point_series

# Open loop: a client whose p99 send slip exceeds this fell behind its schedule (the arrival process was not the one
# asked for), so the point's latencies are suspect.
SLIP_P99_LIMIT_S = 0.05
# A generator at this CPU share or event-loop lag was the bottleneck, not the server.
CLIENT_CPU_LIMIT_PCT = 90.0
CLIENT_LOOP_LAG_LIMIT_MS = 50.0
# Flags that make a point's numbers unfit for comparison (the others are notes).
INVALIDATING = frozenset(
    {
        "client_saturated", "generator_lost", "schedule_slip", "no_rows", "missing_rows", "partial", "failed",
        "interrupted", "pending", "running", "generator_partial", "generator_failed", "status_unknown",
        "unreadable_parts", "missing_parts",
    }
)
# Flags saying the point's records on disk are not all of what it took (a comparison over them is incomplete).
INCOMPLETE = frozenset(
    {
        "no_rows", "missing_rows", "unreadable_parts", "missing_parts", "partial", "failed", "interrupted", "pending",
        "running", "generator_lost", "generator_partial", "generator_failed", "generator_interrupted",
        "status_unknown", "not_in_manifest",
    }
)


def load_requests(run: Run, p: PointInfo) -> m.Requests:
    """The point's per-request metric arrays (all written rows)."""
    table = read_point_requests(run.run_dir, p.point, m.REQUEST_COLUMNS, on_skip=run.skipped(p))
    return m.requests_from_table(table, generator_offsets(run.manifest))


def acceptance(run: Run, p: PointInfo, r: m.Requests, series: dict[str, Series] | None = None) -> tuple[float | None, str | None]:
    """(acceptance length, source): per-request fields, else the manifest's counter window, else scraped counters."""
    per_req = m.acceptance_from_requests(r)
    if per_req is not None:
        return per_req, "requests"
    wa = p.window_acceptance or {}
    if wa.get("accept_length") is not None:
        return float(wa["accept_length"]), "manifest_window"
    s = series if series is not None else point_series(run, p.point)
    got = counter_window_acceptance(p.engine, s)
    return (got, "server_counters") if got is not None else (None, None)


def point_flags(p: PointInfo, r: m.Requests) -> list[str]:
    """The manifest's flags plus what the rows and generator reports show; sorted, no duplicates."""
    flags = set(p.flags)
    if p.status is None:
        flags.add("status_unknown")
    elif p.status != "complete":
        flags.add(str(p.status))
    if not p.in_manifest:
        flags.add("not_in_manifest")
    if p.unreadable_parts:
        flags.add("unreadable_parts")
    if p.missing_parts:
        flags.add("missing_parts")
    if r.n == 0:
        flags.add("no_rows")
    elif p.requests_scheduled is not None and r.n < int(p.requests_scheduled):
        flags.add("missing_rows")
    if r.n and int((~r.ok & ~r.cancelled).sum()):
        flags.add("has_failures")
    for g in p.generators:
        status = g.get("status")
        if status and status != "complete":
            flags.add(f"generator_{status}")
        if (g.get("cpu_pct") or 0) >= CLIENT_CPU_LIMIT_PCT or (g.get("loop_lag_p99_ms") or 0) >= CLIENT_LOOP_LAG_LIMIT_MS:
            flags.add("client_saturated")
    if p.open_loop:
        slip = r.slip[np.isfinite(r.slip)]
        if slip.size and float(np.percentile(slip, 99)) > SLIP_P99_LIMIT_S:
            flags.add("schedule_slip")
    return sorted(flags)


def campaign_row(run: Run, p: PointInfo, r: m.Requests, series: dict[str, Series] | None = None) -> dict[str, Any]:
    """One row of the campaign table (see rig.analysis.metrics for every definition)."""
    start, end, wall = m.window(r)
    tokens = m.total_tokens(r)
    ok = int(r.ok.sum())
    cancelled = int((r.cancelled & ~r.ok).sum())
    accept, source = acceptance(run, p, r, series)
    achieved = None
    if p.open_loop and r.n > 1:
        sends = r.send[np.isfinite(r.send)]
        span = float(sends.max() - sends.min()) if sends.size > 1 else 0.0
        achieved = (sends.size - 1) / span if span > 0 else None
    return {
        "point": p.point,
        "server_config": p.server_config,
        "engine": p.engine,
        "steps": p.steps,
        "workload": p.workload,
        "load_mode": p.load_mode,
        "concurrency": p.concurrency,
        "rate": p.rate,
        "achieved_rate": achieved,
        "repeat": p.repeat,
        "status": p.status,
        "requests": r.n,
        "aggregate_tok_s": m.aggregate_tok_s(tokens, wall),
        "per_request_tok_s": m.nanmean(r.per_request_tok_s[r.ok]),
        "decode_tok_s": m.nanmean(r.decode_tok_s[r.ok]),
        "tokens": tokens,
        "wall_s": wall,
        "first_send_ts": start,
        "last_end_ts": end,
        "ok": ok,
        "failed": r.n - ok - cancelled,
        "cancelled": cancelled,
        "accept_length": accept,
        "accept_source": source,
        "flags": point_flags(p, r),
    }


def sort_key(row: dict[str, Any]) -> tuple:
    """Table order: configuration (by steps), workload, load level, repeat."""
    level = row.get("rate") if row.get("load_mode") not in (None, "closed") else row.get("concurrency")
    return (
        row.get("steps") if row.get("steps") is not None else -1,
        str(row.get("server_config") or ""),
        str(row.get("workload") or ""),
        str(row.get("load_mode") or ""),
        level if level is not None else float("inf"),
        row.get("repeat") or 0,
        row["point"],
    )
