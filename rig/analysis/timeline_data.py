"""A profiled point's records and samples as the timeline reads them (rig.analysis.timeline), on the point's clock."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rig.analysis.metrics import as_float
from rig.analysis.runs import PointInfo, Run, read_point_gpu_metrics, read_point_requests, read_point_server_metrics
from rig.analysis.server_series import RUNNING, _rows_by_name, _series
from rig.analysis.timeline import DEFAULT_WINDOW_S, Events, Samples, Timeline, timeline
from rig.contracts.live import SPEC_STEPS_GAUGES

_COLUMNS = [
    "status",
    "send_ts",
    "first_token_ts",
    "end_ts",
    "clock_offset_s",
    "ttft_s",
    "e2e_s",
    "completion_tokens",
    "spec_verify_ct",
    "chunk_offsets_s",
    "chunk_tokens",
]


def _chunks(t: pa.Table, ok: np.ndarray, send: np.ndarray, end: np.ndarray, tokens: np.ndarray) -> tuple:
    """Each ok request's chunks (arrival time, tokens); a request without chunk times counts all at its end."""
    offsets, counts = t["chunk_offsets_s"].to_pylist(), t["chunk_tokens"].to_pylist()
    times: list[float] = []
    sizes: list[float] = []
    for i in np.flatnonzero(ok):
        offs, ns = offsets[i], counts[i]
        if offs and ns and len(offs) == len(ns):
            times += [send[i] + o for o in offs]
            sizes += ns
        elif np.isfinite(end[i]):
            times.append(end[i])
            sizes.append(tokens[i])
    return np.asarray(times, dtype=float), np.asarray(sizes, dtype=float)


def point_events(run: Run, p: PointInfo) -> Events:
    """The point's requests as timeline events, seconds from its start on the driver's clock."""
    t = read_point_requests(run.run_dir, p.point, _COLUMNS, on_skip=run.note)
    origin = p.start_wall or 0.0
    offset = np.nan_to_num(as_float(t["clock_offset_s"]), nan=0.0)

    def clock(col: str) -> np.ndarray:
        return as_float(t[col]) - offset - origin

    send, first, end = clock("send_ts"), clock("first_token_ts"), clock("end_ts")
    ok = np.asarray(t["status"].to_pylist(), dtype=object) == "ok"
    tokens = np.nan_to_num(as_float(t["completion_tokens"]), nan=0.0)
    ttft, e2e = as_float(t["ttft_s"]), as_float(t["e2e_s"])
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(tokens > 1, (e2e - ttft) / (tokens - 1), np.nan)
    chunk_t, chunk_n = _chunks(t, ok, send, end, tokens)
    return Events(
        send=send[np.isfinite(send)],
        first=first[ok],
        end=end[ok],
        ttft=ttft[ok],
        tpot=tpot[ok],
        tokens=tokens[ok],
        verify=as_float(t["spec_verify_ct"])[ok],
        chunk_t=chunk_t,
        chunk_n=chunk_n,
    )


def point_gauges(run: Run, p: PointInfo) -> dict[str, Samples]:
    """Running requests, active speculative steps (mean over ranks) and GPU power (W, summed over GPUs)."""
    tel = run.server_config(p.server_config).telemetry
    offset = (tel.clock_offset_s if tel is not None else None) or 0.0
    origin = (p.start_wall or 0.0) + offset  # server node clock - driver clock: moved onto the driver's
    t = read_point_server_metrics(run.run_dir, p.point, RUNNING + SPEC_STEPS_GAUGES, on_skip=run.note)
    present = _rows_by_name(t)
    running = _series(t, RUNNING, "sum", present)
    steps = _series(t, SPEC_STEPS_GAUGES, "mean", present)
    return {
        "running": Samples(running.ts - origin, running.values),
        "spec_steps": Samples(steps.ts - origin, steps.values),
        "power_w": _power(run, p, origin),
    }


def _power(run: Run, p: PointInfo, origin: float) -> Samples:
    """Power summed over the GPUs at each sampling round (rounds share a timestamp per GPU sampler)."""
    g = read_point_gpu_metrics(run.run_dir, p.point, ["ts", "power_mw"], on_skip=run.note)
    if g.num_rows == 0:
        return Samples.none()
    ts, mw = as_float(g["ts"]), as_float(g["power_mw"])
    keep = np.isfinite(ts) & np.isfinite(mw)
    uniq, inv = np.unique(ts[keep], return_inverse=True)
    total = np.bincount(inv, weights=mw[keep], minlength=uniq.size) / 1000.0
    return Samples(uniq - origin, total)


def point_timeline(run: Run, p: PointInfo, window_s: float = DEFAULT_WINDOW_S) -> Timeline | None:
    """The timeline of a point that ran a load profile (None for a point of one fixed level)."""
    if not p.phases:
        return None
    tl = timeline(p.point, point_events(run, p), list(p.phases), point_gauges(run, p), window_s)
    if p.start_wall is None:
        tl.notes.append("the manifest has no start_wall: times are epoch seconds")
    return tl


def run_timelines(run: Run, window_s: float = DEFAULT_WINDOW_S) -> list[Timeline]:
    """Every profiled point's timeline, in run order."""
    return [tl for p in run.points if (tl := point_timeline(run, p, window_s)) is not None]
