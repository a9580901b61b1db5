"""The server's own view of a point: /metrics time series summarised next to the client's numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rig.analysis.metrics import acceptance_from_counters, as_float, nanmean
from rig.analysis.runs import PointInfo, Run, read_point_server_metrics

# Each quantity under the names engines publish it as; the first name present in a point wins.
RUNNING = ("sglang:num_running_reqs", "vllm:num_requests_running")
QUEUED = ("sglang:num_queue_reqs", "vllm:num_requests_waiting")
TOKEN_USAGE = ("sglang:token_usage", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
GEN_THROUGHPUT = ("sglang:gen_throughput",)
ACCEPT_GAUGE = ("sglang:spec_accept_length",)
COUNTERS = (
    "sglang:generation_tokens_total",
    "sglang:spec_verify_calls_total",
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_draft_tokens_total",
)
ALL_NAMES = RUNNING + QUEUED + TOKEN_USAGE + GEN_THROUGHPUT + ACCEPT_GAUGE + COUNTERS


@dataclass
class Series:
    """One quantity over time: sample times (epoch s, server scrape clock) and values."""

    ts: np.ndarray
    values: np.ndarray

    @property
    def empty(self) -> bool:
        return self.ts.size == 0


def _series(table: pa.Table, names: tuple[str, ...], how: str) -> Series:
    """Samples of the first of ``names`` present, combined across label sets per scrape (``sum`` or ``mean``)."""
    present = set(table["name"].unique().to_pylist()) if table.num_rows else set()
    for name in names:
        if name in present:
            t = table.filter(pc.equal(table["name"], name))
            # Several label sets (DP ranks, is_streaming) per scrape: requests add up, fractions average.
            g = t.group_by("ts").aggregate([("value", how)]).sort_by("ts")
            return Series(as_float(g["ts"]), as_float(g[f"value_{how}"]))
    return Series(np.empty(0), np.empty(0))


def point_series(run: Run, point: str) -> dict[str, Series]:
    """running, queued, token_usage, gen_throughput and accept_length gauges, and the counters, of one point."""
    t = read_point_server_metrics(run.run_dir, point, ALL_NAMES, on_skip=run.note)
    return {
        "running": _series(t, RUNNING, "sum"),
        "queued": _series(t, QUEUED, "sum"),
        "token_usage": _series(t, TOKEN_USAGE, "mean"),
        "gen_throughput": _series(t, GEN_THROUGHPUT, "sum"),
        "accept_length_gauge": _series(t, ACCEPT_GAUGE, "mean"),
        **{name: _series(t, (name,), "sum") for name in COUNTERS},
    }


def effective_limits(run: Run, p: PointInfo) -> dict[str, Any]:
    """The server's effective max running requests and KV token capacity, from server_info or the startup log."""
    cfg = run.server_config(p.server_config)
    info = cfg.get("server_info") if isinstance(cfg.get("server_info"), dict) else {}
    startup = cfg.get("startup") if isinstance(cfg.get("startup"), dict) else {}
    states = info.get("internal_states") if isinstance(info.get("internal_states"), list) else []
    state0 = states[0] if states and isinstance(states[0], dict) else {}
    # The scheduler's effective value (lowered for speculative decoding) beats the configured one.
    max_running = (
        state0.get("effective_max_running_requests_per_dp")
        or startup.get("max_running_requests")
        or info.get("max_running_requests")
    )
    max_tokens = startup.get("max_total_num_tokens") or info.get("max_total_num_tokens")
    return {"max_running_requests": max_running, "max_total_num_tokens": max_tokens}


def _stat(s: Series, fn: str) -> float | None:
    if s.empty:
        return None
    return nanmean(s.values) if fn == "mean" else float(np.nanmax(s.values))


def summarize_point(run: Run, p: PointInfo, series: dict[str, Series] | None = None) -> dict[str, Any]:
    """Mean/max running and queued requests and token usage, and what they say about the server's limit."""
    s = series if series is not None else point_series(run, p.point)
    limits = effective_limits(run, p)
    row: dict[str, Any] = {
        "point": p.point,
        "samples": int(s["running"].ts.size),
        "running_mean": _stat(s["running"], "mean"),
        "running_max": _stat(s["running"], "max"),
        "queued_mean": _stat(s["queued"], "mean"),
        "queued_max": _stat(s["queued"], "max"),
        "token_usage_mean": _stat(s["token_usage"], "mean"),
        "token_usage_max": _stat(s["token_usage"], "max"),
        "gen_throughput_mean": _stat(s["gen_throughput"], "mean"),
        "accept_length_gauge_mean": _stat(s["accept_length_gauge"], "mean"),
        **limits,
    }
    cap = limits["max_running_requests"]
    # The campaign's C=64 regression: the running batch pinned at the (speculation-lowered) cap while requests queue.
    row["at_running_cap"] = bool(
        cap is not None and row["running_max"] is not None and row["running_max"] >= cap and (row["queued_max"] or 0) > 0
    )
    return row


def counter_window_acceptance(engine: str | None, series: dict[str, Series]) -> float | None:
    """Acceptance length from the first and last scraped counter values of the point."""
    before = {n: float(series[n].values[0]) for n in COUNTERS if not series[n].empty}
    after = {n: float(series[n].values[-1]) for n in COUNTERS if not series[n].empty}
    return acceptance_from_counters(engine, before, after) if before else None
