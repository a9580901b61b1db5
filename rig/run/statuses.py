"""Verdicts: a point's flags and status from its generators' results, the run's status, and its exit code."""

from __future__ import annotations

from typing import Any

from rig.config import LoadSpec

MIN_SATURATION_WINDOW_S = 2.0  # as rig.analysis.points: shorter generator windows cannot show saturation
EXIT_CODES = {"complete": 0, "partial": 1, "failed": 1, "interrupted": 130}  # by run status; anything else 1


def point_verdict(gens: list[dict[str, Any]], records: dict[str, int], load: LoadSpec, server_died: int | None,
                  stopped: bool, flags_before: list[str] | None) -> tuple[list[str], str, str | None]:
    """(flags, status, error or None) of a point whose generators returned ``gens``."""
    flags = set(flags_before or [])
    for r in gens:
        if r.get("status") == "failed" or "died" in (r.get("error") or ""):
            flags.add("generator_lost")
        # a lag percentile over a blink of time (every request failing in milliseconds) is not evidence
        if (r.get("loop_lag_p99_ms") or 0) > load.loop_lag_threshold_s * 1e3 and \
                (r.get("window_s") is None or r["window_s"] >= MIN_SATURATION_WINDOW_S):
            flags.add("client_saturated")
        if load.mode != "closed" and (r.get("slip_p99_s") or 0) > load.slip_threshold_s:
            flags.update({"schedule_slip", "client_saturated"})
        if load.mode != "closed" and (r.get("rate_ratio") or 1.0) < 0.99:  # achieved < 99 % of the schedule
            flags.update({"rate_shortfall", "client_saturated"})
    if server_died is not None:
        flags.add("server_died")
    error = None
    if server_died is not None:
        status = "failed"
        error = f"server exited with code {server_died} during the point"
    elif all(r.get("status") == "failed" for r in gens):
        status = "failed"
        error = "every generator failed: " + "; ".join(str(r.get("error")) for r in gens)
    elif stopped:
        status = "interrupted"
    elif records["ok"] == 0 and records["failed"] > 0:
        status = "failed"
        error = f"no request succeeded ({records['failed']} failed)"
    elif any(r.get("status") != "complete" for r in gens) or records["ok"] == 0:
        status = "partial"
    else:
        status = "complete"
    return sorted(flags), status, error


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
