"""Response bodies with SGLang's shapes: native /generate chunks and their meta_info."""

from __future__ import annotations

import json
import time
from typing import Any

from rig.sim.engine import Engine, Stream

_dumps = json.dumps


def speculative_fields(st: Stream, steps: int) -> dict[str, Any]:
    """Per-request speculative statistics (finished chunk only), under SGLang 0.5.23's names."""
    r = st.req
    if steps <= 0 or r.verify_ct <= 0:
        return {}
    # tokenizer_manager.py:3155-3164 (0.5.23) counts proposed drafts with the launch's speculative_num_draft_tokens:
    # under --speculative-adaptive the tiers the scheduler switched to do not reach it, so the rate is off the same way
    proposed = r.verify_ct * steps
    hist = list(r.hist)
    return {
        "spec_verify_ct": r.verify_ct,
        "spec_accept_length": st.n_tokens / r.verify_ct,
        "spec_accept_rate": r.accepted_drafts / proposed if proposed else 0.0,
        "spec_num_correct_drafts": r.accepted_drafts,
        "spec_num_proposed_drafts": proposed,
        "spec_correct_drafts_histogram": hist,
    }  # 0.5.23's names only: the legacy aliases (0.5.15's, 0.5.9's) are gone there; rig's client reads either


def scheduler_time_fields(st: Stream, engine: Engine) -> dict[str, Any]:
    """The scheduler's time stats (epoch seconds), on every chunk with --enable-metrics, as SGLang 0.5.17 and 0.5.23
    send them (managers/tokenizer_manager.py::_handle_batch_output, observability/req_time_stats.py
    convert_to_output_meta_info of the scheduler's stats)."""
    r = st.req
    out: dict[str, Any] = {}
    if r.admit_t is not None:
        if r.arrival is None:  # Scheduler.add sets it before any admission
            raise RuntimeError(f"sim: request {r.rid} admitted without an arrival time")
        out["forward_entry_time"] = engine.wall(r.admit_t)
    if r.prefill_done_t is not None:
        out["prefill_finished_time"] = engine.wall(r.prefill_done_t)
    if r.admit_t is not None and r.arrival is not None:
        out["queue_time"] = r.admit_t - r.arrival
    return out


def timing_fields(st: Stream, engine: Engine) -> dict[str, Any]:
    """The request's own timestamps (epoch seconds) and latencies, as with --enable-metrics; finished chunk only."""
    out: dict[str, Any] = {"request_received_ts": st.received_wall, "api_server_dispatch_finish_ts": st.received_wall}
    if st.first_token_wall is not None:
        out["first_token_ts"] = st.first_token_wall
        out["first_token_latency"] = st.first_token_wall - st.received_wall
    if st.finished_wall is not None:
        out["request_finished_ts"] = st.finished_wall
        if st.first_token_wall is not None and st.finished_wall > st.first_token_wall:
            out["decode_throughput"] = st.n_tokens / (st.finished_wall - st.first_token_wall)
    # when the first answer went out (the first streamed chunk, or the whole answer): the same value on the finished
    # chunk of a stream (req_time_stats.py convert_to_output_meta_info)
    out["response_sent_to_client_ts"] = st.sent_wall if st.sent_wall is not None else time.time()
    return out


def meta_info(st: Stream, engine: Engine, *, enable_metrics: bool) -> dict[str, Any]:
    """One answer's meta_info, its keys in SGLang's order (tokenizer_manager.py::_handle_batch_output, 0.5.17 and
    0.5.23): called once per chunk sent, the first call being the first answer out."""
    meta: dict[str, Any] = {
        "id": st.rid,
        "finish_reason": st.finish_reason,
        "prompt_tokens": st.prompt_tokens,
        "weight_version": "default",
        "num_retractions": 0,
    }
    if enable_metrics:
        meta.update(scheduler_time_fields(st, engine))
    cached = st.req.cached
    meta.update(
        {
            "reasoning_tokens": 0,
            "completion_tokens": st.n_tokens,
            "cached_tokens": cached,
            # output_streamer.py get_cached_tokens_details: None without a cache hit; no host or storage tier here
            "cached_tokens_details": {"device": cached, "host": 0} if cached > 0 else None,
            "dp_rank": None,  # set only under DP attention (the sim has none)
        }
    )
    if st.sent_wall is None:
        # the first answer out carries when it was sent (tokenizer_manager.py, with or without --enable-metrics)
        st.sent_wall = time.time()
        meta["response_sent_to_client_ts"] = st.sent_wall
    if st.finished:
        meta["e2e_latency"] = (st.finished_wall or st.received_wall) - st.received_wall
        meta.update(speculative_fields(st, engine.cfg.steps))
        if enable_metrics:
            meta.update(timing_fields(st, engine))
    return meta


def native_body(st: Stream, engine: Engine, *, enable_metrics: bool) -> str:
    """One /generate object: cumulative text and output_ids, plus meta_info (assembled by hand: ids grow long)."""
    meta = meta_info(st, engine, enable_metrics=enable_metrics)
    return '{"text":' + _dumps(st.text) + ',"output_ids":[' + st.ids_csv + '],"meta_info":' + _dumps(meta) + "}"


def usage(st: Stream, *, cache_report: bool) -> dict[str, Any]:
    u: dict[str, Any] = {
        "prompt_tokens": st.prompt_tokens,
        "completion_tokens": st.n_tokens,
        "total_tokens": st.prompt_tokens + st.n_tokens,
        "prompt_tokens_details": {"cached_tokens": st.req.cached} if cache_report else None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,  # openai/protocol.py::UsageInfo: set only with reasoning tokens
    }
    return u


def finish_name(st: Stream) -> str | None:
    fr = st.finish_reason
    return None if fr is None else fr["type"]


def matched_stop(st: Stream) -> Any:
    fr = st.finish_reason
    return fr.get("matched") if fr and fr["type"] == "stop" else None
