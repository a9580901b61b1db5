"""Verdicts: a point's flags and status from its generators' results, the run's status, and its exit code."""

from __future__ import annotations

from rig.contracts import GeneratorReport, RecordCounts, Thresholds, judge_point

EXIT_CODES = {"complete": 0, "partial": 1, "failed": 1, "interrupted": 130}  # by run status; anything else 1


def point_verdict(gens: list[GeneratorReport], records: RecordCounts, load_mode: str, thresholds: Thresholds,
                  server_died: int | None, stopped: bool, before: dict[str, str] | None
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
