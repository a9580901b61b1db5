"""The server's own view of a point: /metrics time series summarised next to the client's numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rig.analysis.metrics import acceptance_from_counters, as_float, nanmean
from rig.analysis.runs import PointInfo, Run, read_point_server_metrics
from rig.contracts import ServerRow
from rig.contracts.label_sets import kept_label_json

# Each quantity under the names engines publish it as; the first name present in a point wins.
RUNNING = ("sglang:num_running_reqs", "vllm:num_requests_running")
QUEUED = ("sglang:num_queue_reqs", "vllm:num_requests_waiting")
TOKEN_USAGE = ("sglang:token_usage", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
GEN_THROUGHPUT = ("sglang:gen_throughput",)
ACCEPT_GAUGE = ("sglang:spec_accept_length",)
SPEC_STEPS = ("sglang:spec_num_steps",)  # the active speculative steps (SGLang's metrics_reporter.py)
COUNTERS = (
    "sglang:generation_tokens_total",
    "sglang:spec_verify_calls_total",
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_draft_tokens_total",
)
ALL_NAMES = RUNNING + QUEUED + TOKEN_USAGE + GEN_THROUGHPUT + ACCEPT_GAUGE + SPEC_STEPS + COUNTERS


@dataclass
class Series:
    """One quantity over time: sample times (epoch s, server scrape clock) and values."""

    ts: np.ndarray
    values: np.ndarray

    @property
    def empty(self) -> bool:
        return self.ts.size == 0


def _series(table: pa.Table, names: tuple[str, ...], how: str, present: dict[str, np.ndarray]) -> Series:
    """Samples of the first of ``names`` present, combined across label sets per scrape (``sum``, ``mean`` or
    ``max``)."""
    for name in names:
        if name in present:
            idx = present[name]
            if "labels" in table.column_names:  # a rank's or a priority's copy of the total is not added to it
                labels = table["labels"].take(pa.array(idx))
                kept = kept_label_json(str(v) for v in pc.unique(labels).to_pylist() if v is not None)
                mask = pc.fill_null(pc.is_in(labels, value_set=pa.array(sorted(kept), pa.string())), True)
                idx = idx[np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)]
            ts = as_float(table["ts"].take(pa.array(idx)))
            values = as_float(table["value"].take(pa.array(idx)))
            keep = np.isfinite(ts) & np.isfinite(values)
            ts, values = ts[keep], values[keep]
            # Several label sets (DP ranks, is_streaming) per scrape: requests add up, fractions average.
            uniq, inv = np.unique(ts, return_inverse=True)
            # bincount with weights gives floats (numpy's stubs type every bincount as integers)
            total: np.ndarray = np.bincount(inv, weights=values, minlength=uniq.size)
            if how == "mean":
                total = total / np.bincount(inv, minlength=uniq.size)
            elif how == "max":  # every rank runs the same steps: the largest any reports
                total = np.full(uniq.size, -np.inf)
                np.maximum.at(total, inv, values)
            return Series(uniq, total)
    return Series(np.empty(0), np.empty(0))


def _rows_by_name(table: pa.Table) -> dict[str, np.ndarray]:
    """Row indices of each metric name (one pass over the name column)."""
    if table.num_rows == 0:
        return {}
    enc = pc.dictionary_encode(table["name"]).combine_chunks()
    codes = np.asarray(enc.indices.to_numpy(zero_copy_only=False))
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(enc.dictionary) + 1))
    return {str(n): order[bounds[i] : bounds[i + 1]] for i, n in enumerate(enc.dictionary.to_pylist())}


def point_series(run: Run, point: str) -> dict[str, Series]:
    """running, queued, token_usage, gen_throughput, accept_length and spec_steps gauges, and the counters, of one
    point."""
    t = read_point_server_metrics(run.run_dir, point, ALL_NAMES, on_skip=run.note)
    present = _rows_by_name(t)
    return {
        "running": _series(t, RUNNING, "sum", present),
        "queued": _series(t, QUEUED, "sum", present),
        "token_usage": _series(t, TOKEN_USAGE, "mean", present),
        "gen_throughput": _series(t, GEN_THROUGHPUT, "sum", present),
        "accept_length_gauge": _series(t, ACCEPT_GAUGE, "mean", present),
        "spec_steps": _series(t, SPEC_STEPS, "max", present),
        **{name: _series(t, (name,), "sum", present) for name in COUNTERS},
    }


@dataclass(frozen=True)
class ServerLimits:
    """The server's effective max running requests (per DP rank) and KV token capacity, as it reported them."""

    max_running_requests: Any
    max_total_num_tokens: Any


def effective_limits(run: Run, p: PointInfo) -> ServerLimits:
    """The server's effective max running requests and KV token capacity, from server_info or the startup log."""
    cfg = run.server_config(p.server_config)
    info = cfg.server_info if isinstance(cfg.server_info, dict) else {}
    startup = cfg.startup or {}
    states = info.get("internal_states") if isinstance(info.get("internal_states"), list) else []
    state0 = states[0] if states and isinstance(states[0], dict) else {}
    # The scheduler's effective value (lowered for speculative decoding) beats the configured one.
    max_running = (
        state0.get("effective_max_running_requests_per_dp")
        or startup.get("max_running_requests")
        or info.get("max_running_requests")
    )
    max_tokens = startup.get("max_total_num_tokens") or info.get("max_total_num_tokens")
    return ServerLimits(max_running, max_tokens)


def dp_ranks(run: Run, p: PointInfo) -> int:
    """Data-parallel ranks of the point's server: /server_info lists one internal_states entry per rank
    (entrypoints/http_server.py), else its dp_size; 1 when the server does not say."""
    info = run.server_config(p.server_config).server_info
    if not isinstance(info, dict):
        return 1
    states = info.get("internal_states")
    if isinstance(states, list) and states:
        return len(states)
    dp = info.get("dp_size")
    return dp if isinstance(dp, int) and dp > 0 else 1


def _stat(s: Series, fn: str) -> float | None:
    if s.empty:
        return None
    return nanmean(s.values) if fn == "mean" else float(np.nanmax(s.values))


def summarize_point(run: Run, p: PointInfo, series: dict[str, Series] | None = None) -> ServerRow:
    """Mean/max running and queued requests and token usage, and what they say about the server's limit."""
    s = series if series is not None else point_series(run, p.point)
    limits = effective_limits(run, p)
    running_max, queued_max = _stat(s["running"], "max"), _stat(s["queued"], "max")
    cap = limits.max_running_requests
    if cap is not None:  # the cap is per DP rank; the running gauge is summed over the ranks (_series)
        cap *= dp_ranks(run, p)
    # The campaign's C=64 regression: the running batch pinned at the (speculation-lowered) cap while requests queue.
    at_cap = bool(cap is not None and running_max is not None and running_max >= cap and (queued_max or 0) > 0)
    return ServerRow.make(
        point=p.point,
        samples=int(s["running"].ts.size),
        running_mean=_stat(s["running"], "mean"),
        running_max=running_max,
        queued_mean=_stat(s["queued"], "mean"),
        queued_max=queued_max,
        token_usage_mean=_stat(s["token_usage"], "mean"),
        token_usage_max=_stat(s["token_usage"], "max"),
        gen_throughput_mean=_stat(s["gen_throughput"], "mean"),
        accept_length_gauge_mean=_stat(s["accept_length_gauge"], "mean"),
        max_running_requests=limits.max_running_requests,
        max_total_num_tokens=limits.max_total_num_tokens,
        at_running_cap=at_cap,
    )


def counter_window_acceptance(engine: str | None, series: dict[str, Series]) -> float | None:
    """Acceptance length from the first and last scraped counter values of the point."""
    before = {n: float(series[n].values[0]) for n in COUNTERS if not series[n].empty}
    after = {n: float(series[n].values[-1]) for n in COUNTERS if not series[n].empty}
    return acceptance_from_counters(engine, before, after) if before else None
