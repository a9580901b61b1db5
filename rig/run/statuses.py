"""Verdicts: a point's flags and status from its generators' results, the run's status, and its exit code."""

from __future__ import annotations

from rig.contracts import GeneratorReport, RecordCounts, Thresholds, judge_point
from rig.loadgen.dialects import Dialect

EXIT_CODES = {"complete": 0, "partial": 1, "failed": 1, "interrupted": 130}  # by run status; anything else 1


def point_verdict(
    gens: list[GeneratorReport],
    records: RecordCounts,
    load_mode: str,
    thresholds: Thresholds,
    server_died: int | None,
    stopped: bool,
    before: dict[str, str] | None,
) -> tuple[dict[str, str], str, str | None]:
    """(flags with their reasons, status, error or None) of a point whose generators returned ``gens``; the flags
    are rig.contracts.judge_point's (kept with any the entry had before)."""
    died = f"server exited with code {server_died} during the point" if server_died is not None else None
    flags = {**(before or {}), **judge_point(load_mode, gens, thresholds, died)}
    error = None
    if died is not None:
        status = "failed"
        error = died
    elif all(r.status == "failed" for r in gens):
        status = "failed"
        error = "every generator failed: " + "; ".join(str(r.error) for r in gens)
    elif stopped:
        status = "interrupted"
    elif records.ok == 0 and records.failed > 0:
        status = "failed"
        error = f"no request succeeded ({records.failed} failed)"
    elif any(r.status != "complete" for r in gens) or records.ok == 0:
        status = "partial"
    else:
        status = "complete"
    return flags, status, error


def dialect_flags(gens: list[GeneratorReport], ok: int, dialect: Dialect | None) -> dict[str, str]:
    """What the point's dialect could not do, as flags with their figures: requests that asked for a fixed length
    and ended early (``ended_early``), completion tokens counted from chunks (``tokens_estimated``), chunk token
    counts that do not sum to the server's completion tokens (``chunk_tokens_mismatch``)."""
    why: dict[str, str] = {}
    early = sum(g.ended_early for g in gens)
    if early:
        cause = (
            f"the {dialect.name} dialect cannot send ignore_eos (not in OpenAI's API)"
            if dialect is not None and not dialect.ignore_eos
            else "the server stopped despite ignore_eos"
        )
        why["ended_early"] = (
            f"{early} of {ok} requests asked for a fixed length (max_tokens) and ended early: "
            f"{cause}; their lengths follow the model's EOS"
        )
    estimated = sum(g.tokens_estimated for g in gens)
    if estimated:
        why["tokens_estimated"] = (
            f"{estimated} of {ok} requests' completion tokens are estimates counted from "
            f"streamed chunks (completion_tokens_source=chunks): the server sent no usage"
        )
    mismatched = sum(g.chunk_tokens_mismatch for g in gens)
    if mismatched:
        why["chunk_tokens_mismatch"] = (
            f"{mismatched} of {ok} requests' chunk token counts do not sum to their completion_tokens: the server "
            "sent neither token ids nor a running usage per chunk (SGLang 0.5.16's completions has no "
            "return_token_ids), so ITL spreads the wrong tokens over the chunks"
        )
    return why


# Above this share of inter-chunk gaps read together, a p99 inter-token latency is the client's read cadence; below
# a hundred gaps there is no p99 to speak of (one shared read in 39 gaps was 2.6 %).
READ_BOUND_SHARE = 0.01
READ_BOUND_MIN_GAPS = 100


def read_bound_flag(gens: list[GeneratorReport]) -> dict[str, str]:
    """``itl_read_bound`` where more than 1 % of the gaps between chunks were 0 because the client read two of the
    server's writes at once: both chunks carry one arrival time, so ITL's upper percentiles there are bounded by how
    often the generator read, not by the server (a note, not a reason to drop the point's throughput)."""
    gaps = sum(g.chunk_gaps for g in gens)
    shared = sum(g.gaps_in_one_read for g in gens)
    if gaps < READ_BOUND_MIN_GAPS or shared <= READ_BOUND_SHARE * gaps:
        return {}
    return {
        "itl_read_bound": (
            f"{shared:,} of {gaps:,} inter-chunk gaps ({100 * shared / gaps:.1f} %) came in one read with the chunk "
            "before (one arrival time for both): ITL percentiles above "
            f"p{100 * (1 - shared / gaps):.0f} are the client's read cadence; fewer streams per generator core "
            "(more --clients) remove it"
        )
    }


def run_status(point_statuses: list[str], error: str | None, interrupted: bool) -> str:
    """A run's status from its points' statuses, its run-level error and whether it was stopped."""
    if interrupted:
        return "interrupted"
    if error:
        return "failed"
    if all(s == "complete" for s in point_statuses):
        return "complete"
    if all(s == "failed" for s in point_statuses):
        return "failed"
    return "partial"
