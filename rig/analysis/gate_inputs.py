"""What the regression gate cannot vouch for (``rig compare --max-regression``), each a failed check of its own.

A threshold is judged on the requests both points served ok, so on its own it cannot see what the candidate did not
serve: a candidate whose every request failed, or whose slowest half did, would pass. These checks fail the gate
beside the thresholds, one line each:

- **served**: requests the baseline served ok that the candidate failed, cancelled or has no record of (a level
  bound by its duration ends when its time is up, so there only failed ones count: a slower point sends fewer);
- **inputs**: a point of the pair flagged invalid or incomplete (rig.analysis.points.INVALIDATING and INCOMPLETE:
  a saturated client, unreadable part files, missing rows, a point that did not complete ...);
- **coverage**: a point of one side with no counterpart on the other (a level or a configuration the candidate
  was not measured at, or one the baseline lacks); within one run, a configuration with no point at a level;
- a threshold with no request served ok by both points has nothing to judge.

``--allow-incomplete`` waives these (verdict ``waived``): the gate then judges only what is there (and fails when
nothing is: every check waived, no request judged). Failed requests
are not waived: they are evidence that the candidate is worse, not a gap in it (a candidate whose every request got
HTTP 500 fails with or without the flag). ``--max-regression failed=PCT%`` tolerates a share of them (0 by default).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from rig.analysis.pairing import Side, _per_request
from rig.analysis.points import INCOMPLETE, INVALIDATING, flag_reasons, load_requests, top_errors
from rig.analysis.rows import GateRow
from rig.analysis.runs import PointInfo, read_point_requests

REJECTED_FLAGS = INVALIDATING | INCOMPLETE
INPUT_CHECKS = ("served", "inputs", "coverage")
NOT_WAIVED = " (failed requests are not waived: --max-regression failed=PCT% tolerates a share of them)"


def _row(base: str | None, cand: str | None, metric: str, verdict: str, why: str, **figures: Any) -> GateRow:
    """A gate row of the threshold rows' shape (rig.contracts.GateVerdict plus the pair and its inputs note)."""
    row = GateRow(
        baseline=base,
        candidate=cand,
        metric=metric,
        threshold=figures.get("threshold"),
        pairs=figures.get("pairs"),
        regression=figures.get("regression"),
        ci_low=None,
        ci_high=None,
        verdict=verdict,
        why=why,
        incomplete=None,
    )
    if "failed" in figures:
        row["failed"] = figures["failed"]
    return row


def bound_by_duration(side: Side) -> bool:
    """The point's level ran for a set time (the spec's load.duration_s), not a set number of requests."""
    spec = side.run.manifest.spec or {}
    load = spec.get("load") if isinstance(spec.get("load"), dict) else {}
    return side.point.requests_planned is None and (load or {}).get("duration_s") is not None


def _statuses(side: Side) -> pa.Table:
    """request_id and status of every record of the point (kept while its part files are unchanged)."""

    def read() -> pa.Table:
        return read_point_requests(
            side.run.run_dir, side.point.point, ["request_id", "status"], on_skip=side.run.skipped(side.point)
        )

    return side.run.memo("gate_statuses", side.point.point, read)


def _ids(t: pa.Table, status: str) -> pa.Array:
    return t["request_id"].filter(pc.equal(t["status"], status)).combine_chunks()


def served_row(base: Side, cand: Side, tolerance: float = 0.0) -> GateRow:
    """Fail when the candidate did not serve ok a request the baseline served ok (see the module docstring);
    ``tolerance``: the share of them that may have failed (``--max-regression failed=PCT%``)."""
    served = _per_request(base)[0]["request_id"].combine_chunks()
    rec = _statuses(cand)
    lost = pc.invert(pc.is_in(served, value_set=_ids(rec, "ok")))
    not_ok = served.filter(lost)
    failed = int(pc.sum(pc.is_in(not_ok, value_set=_ids(rec, "failed"))).as_py() or 0)
    cancelled = int(pc.sum(pc.is_in(not_ok, value_set=_ids(rec, "cancelled"))).as_py() or 0) if len(not_ok) else 0
    absent = len(not_ok) - failed - cancelled
    by_duration = bound_by_duration(base) or bound_by_duration(cand)
    counted = failed if by_duration else len(not_ok)
    n = len(served)
    figures = {"threshold": tolerance, "pairs": n, "regression": counted / n if n else None, "failed": failed}
    note = " (levels bound by duration: only failed requests count)" if by_duration else ""
    if tolerance:
        note += f" (failed={tolerance:.1%} tolerated)"
    if not n:
        return _row(base.label, cand.label, "served", "pass", f"{base.label} served no request ok", **figures)
    too_many = failed / n > tolerance
    if counted == failed and not too_many:  # nothing lost but failures within the tolerance, if any
        why = (
            f"every one of the {n:,} requests {base.label} served ok was served ok{note}"
            if not counted
            else f"{failed:,} of the {n:,} requests {base.label} served ok failed ({failed / n:.1%}){note}"
        )
        if not counted and by_duration:
            why = f"none of the {n:,} requests {base.label} served ok failed{note}"
        return _row(base.label, cand.label, "served", "pass", why, **figures)
    parts = [f"{failed:,} failed{_top_error(cand)}"] if failed else []
    if not by_duration:
        parts += [f"{cancelled:,} cancelled"] if cancelled else []
        parts += [f"{absent:,} not in its records"] if absent else []
    why = f"{cand.label} did not serve {counted:,} of the {n:,} requests {base.label} served ok ({', '.join(parts)})"
    return _row(base.label, cand.label, "served", "fail", why + note, **figures)


def _top_error(side: Side) -> str:
    """': most often HTTP 500' from the point's failures (empty when it has no message)."""
    errors = [
        e for e in top_errors(side.run, side.point, 3, load_requests(side.run, side.point)) if e.status == "failed"
    ]
    return f": most often {errors[0].error}" if errors else ""


def inputs_row(base: Side, cand: Side) -> GateRow | None:
    """Fail when either point is flagged invalid or incomplete; None when neither is."""
    parts = []
    for side in (base, cand):
        reasons = flag_reasons(side.point, load_requests(side.run, side.point))
        bad = [f"{f} ({reasons[f]})" for f in reasons if f in REJECTED_FLAGS]
        if bad:
            parts.append(f"{side.label}: {'; '.join(bad)}")
    if not parts:
        return None
    why = "a point flagged invalid or incomplete cannot be vouched for: " + " | ".join(parts)
    return _row(base.label, cand.label, "inputs", "fail", why)


def level_text(p: PointInfo) -> str:
    """'greedy closed c=4 repeat 0' (the load level a point ran)."""
    level = f"c={p.concurrency}" if not p.open_loop else f"rate={p.rate:g}/s" if p.rate is not None else "trace"
    return f"{p.workload} {p.load_mode} {level} repeat {p.repeat}"


def _config_text(p: PointInfo) -> str:
    return f"{p.server_config} (steps={p.steps})"


def unpaired_rows(pairs: list[tuple[Side, Side]], sides: list[Side], baseline_run: object) -> list[GateRow]:
    """Two runs: a fail for every point of either with no counterpart in the other."""
    paired = {id(s.point) for pair in pairs for s in pair}
    out = []
    for s in sides:
        if id(s.point) in paired:
            continue
        where = f"{s.label} ({level_text(s.point)}, {_config_text(s.point)})"
        if s.run is baseline_run:
            out.append(_row(s.label, None, "coverage", "fail", f"{where}: the candidate was not measured there"))
        else:
            out.append(
                _row(None, s.label, "coverage", "fail", f"{where}: the baseline has no point there to compare with")
            )
    return out


def grid_rows(sides: list[Side]) -> list[GateRow]:
    """One run: a fail for every configuration with no point at a load level another configuration has."""
    levels: dict[tuple, PointInfo] = {}
    configs: dict[str | None, PointInfo] = {}
    have = set()
    for s in sides:
        levels.setdefault(s.point.level_key(), s.point)
        configs.setdefault(s.point.server_config, s.point)
        have.add((s.point.level_key(), s.point.server_config))
    out = []
    for key, at in levels.items():
        for cid, cfg in configs.items():
            if (key, cid) not in have:
                why = f"configuration {_config_text(cfg)} has no point at {level_text(at)}"
                out.append(_row(None, None, "coverage", "fail", why))
    return out


def _evidence(r: GateRow) -> bool:
    """The check failed on evidence, not for want of it: more of the candidate's requests failed than tolerated."""
    pairs = r["pairs"]
    return r["metric"] == "served" and bool(pairs) and r.get("failed", 0) / (pairs or 1) > (r["threshold"] or 0)


def waive(rows: list[GateRow], allow_incomplete: bool) -> list[GateRow]:
    """With --allow-incomplete, the failed input checks become ``waived`` (thresholds judged on evidence stand, and so
    do failed requests: a candidate that answers errors is not incomplete, it is worse)."""
    if not allow_incomplete:
        return rows
    out = []
    for r in rows:
        if r["verdict"] == "fail" and _evidence(r):
            r = {**r, "why": r["why"] + NOT_WAIVED}
        elif r["verdict"] == "fail" and (r["metric"] in INPUT_CHECKS or not r["pairs"]):
            r = {**r, "verdict": "waived", "why": r["why"] + " (waived: --allow-incomplete)"}
        out.append(r)
    judged = [r for r in out if r["verdict"] != "waived" and r["metric"] not in ("inputs", "coverage") and r["pairs"]]
    if not judged:  # judging only what is there, when nothing is, vouches for nothing
        why = "every check was waived: no request was judged, so --allow-incomplete has nothing to pass"
        out.append(_row(None, None, "evidence", "fail", why))
    return out


def summary(rows: list[GateRow]) -> str:
    """'gate: FAIL, 2 of 5 checks failed' / 'gate: pass, 5 checks (1 waived by --allow-incomplete)'."""
    counts = Counter(r["verdict"] for r in rows)
    waived = f" ({counts['waived']} waived by --allow-incomplete)" if counts["waived"] else ""
    if counts["fail"]:
        return f"gate: FAIL, {counts['fail']} of {len(rows)} checks failed{waived}"
    return f"gate: pass, {len(rows)} checks{waived}"
