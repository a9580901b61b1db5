"""What a server says about a request beside its tokens: per-request speculative statistics and timestamps."""

from __future__ import annotations

from typing import Any

from rig.loadgen.bodies import SpecStats

# Names of accepted / proposed draft counts across SGLang versions (0.5.9, 0.5.15 legacy, 0.5.15+).
_ACCEPTED_KEYS = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
_PROPOSED_KEYS = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")


def speculative_fields(src: dict[str, Any]) -> SpecStats:
    """SGLang's per-request speculative statistics (meta_info, sglext.spec_tokens_details) under any version's names."""
    out: SpecStats = {}
    if src.get("spec_verify_ct") is not None:
        out["spec_verify_ct"] = int(src["spec_verify_ct"])
    if src.get("spec_accept_length") is not None:
        out["spec_accept_length"] = float(src["spec_accept_length"])
    for k in _ACCEPTED_KEYS:
        if src.get(k) is not None:
            out["spec_accepted_drafts"] = int(src[k])
            break
    for k in _PROPOSED_KEYS:
        if src.get(k) is not None:
            out["spec_proposed_drafts"] = int(src[k])
            break
    return out


def vllm_speculative_fields(sd: dict[str, Any]) -> SpecStats:
    """vLLM's per-request summary (--per-request-spec-decode-metrics summary) on the usage chunk."""
    steps, accepted, drafted = sd.get("num_spec_steps"), sd.get("num_accepted_draft_tokens"), sd.get("num_draft_tokens")
    if not (isinstance(steps, int) and isinstance(accepted, int) and isinstance(drafted, int)) or steps <= 0:
        return {}
    return {
        "spec_verify_ct": steps,
        "spec_accepted_drafts": accepted,
        "spec_proposed_drafts": drafted,
        "spec_accept_length": 1.0 + accepted / steps,
    }


def server_timestamps(meta: dict[str, Any]) -> dict[str, float]:
    """The server's own timestamps of a request (SGLang's meta_info with --enable-metrics), on its clock."""
    out: dict[str, float] = {}
    rec = meta.get("request_received_ts")
    if isinstance(rec, (int, float)):
        out["server_received_ts"] = float(rec)
        ftl = meta.get("first_token_latency")
        if isinstance(ftl, (int, float)):
            out["server_first_token_ts"] = float(rec) + float(ftl)
    if isinstance(meta.get("first_token_ts"), (int, float)):
        out["server_first_token_ts"] = float(meta["first_token_ts"])
    fin = meta.get("request_finished_ts")
    if isinstance(fin, (int, float)):
        out["server_finished_ts"] = float(fin)
    if isinstance(meta.get("queue_time"), (int, float)):
        out["server_queue_s"] = float(meta["queue_time"])
    return out
