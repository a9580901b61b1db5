"""The pairing underneath rig compare and the report's paired intervals: a side (one point of one run), its ok
requests by request_id, two sides joined on them, and the notes on incomplete inputs and subsampled bootstraps."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from rig.analysis import metrics as m
from rig.analysis import resample as rs
from rig.analysis.points import INCOMPLETE, load_requests, point_flags
from rig.analysis.rows import PairIdentity
from rig.analysis.runs import PointInfo, Run, generator_offsets, read_point_requests

RESAMPLES = 2000
SEED = 0
CONFIDENCE = 0.95
_BATCH_CELLS = rs.BATCH_CELLS


@dataclass
class Side:
    """One point of one run."""

    run: Run
    point: PointInfo
    label: str


def pair_identity(base: Side, cand: Side) -> PairIdentity:
    """The columns that say which two points a comparison row pairs (the load level is the candidate's)."""
    return {
        "baseline": base.label,
        "candidate": cand.label,
        "baseline_point": base.point.point,
        "candidate_point": cand.point.point,
        "workload": cand.point.workload,
        "load_mode": cand.point.load_mode,
        "concurrency": cand.point.concurrency,
        "rate": cand.point.rate,
        "repeat": cand.point.repeat,
        "baseline_steps": base.point.steps,
        "candidate_steps": cand.point.steps,
    }


def note_subsample(run: Run, n: int) -> None:
    """Say once per run that its intervals came from the m-out-of-n bootstrap (only when one did)."""
    if rs.draws(n) < n:
        run.note(rs.subsample_note())


def incomplete(side: Side, r: m.Requests | None = None) -> list[str]:
    """Why this side's records are not all of what its point took (empty: complete)."""
    r = r if r is not None else load_requests(side.run, side.point)
    return sorted(set(point_flags(side.point, r)) & INCOMPLETE)


def _inputs_note(*sides: tuple[Side, list[str]]) -> str | None:
    """'A:point: missing_rows; ...' for every side with incomplete inputs, or None."""
    parts = [f"{s.label}: {', '.join(why)}" for s, why in sides if why]
    return "; ".join(parts) or None


def _per_request(side: Side) -> tuple[pa.Table, list[str], bool]:
    """request_id plus the four speedup metrics of the point's ok requests in request_id order, why its inputs are
    incomplete, and whether its request ids are distinct (kept for the next call: the speedups, the intervals and
    the gate read the same point; sorted once here, not once per pair)."""

    def read() -> tuple[pa.Table, list[str], bool]:
        # The metric arrays as the report derived them (kept by load_requests: the schedule and intervals read them
        # too), and the ids alone beside them; all columns at once if the files changed between the two reads.
        r = load_requests(side.run, side.point)
        ids = read_point_requests(
            side.run.run_dir, side.point.point, ["request_id"], on_skip=side.run.skipped(side.point)
        )
        if ids.num_rows != r.n:
            t = read_point_requests(
                side.run.run_dir, side.point.point, m.REQUEST_COLUMNS, on_skip=side.run.skipped(side.point)
            )
            r, ids = m.requests_from_table(t, generator_offsets(side.run.manifest)), t
        why = incomplete(side, r)
        keep = pa.array(r.ok)
        out = pa.table(
            {
                "request_id": ids["request_id"].filter(keep),
                "e2e": r.e2e[r.ok],
                "ttft": r.ttft[r.ok],
                "tpot": r.tpot[r.ok],
                "decode_tok_s": r.decode_tok_s[r.ok],
                "tokens": r.tokens[r.ok],
            }
        )
        out = out.take(pc.sort_indices(out["request_id"])) if out.num_rows else out
        ids = out["request_id"]
        distinct = ids.null_count == 0 and (
            out.num_rows < 2 or not pc.any(pc.equal(ids.slice(1), ids.slice(0, out.num_rows - 1))).as_py()
        )
        return out, why, distinct

    return side.run.memo("per_request", side.point.point, read)


def paired_table(base: Side, cand: Side) -> tuple[pa.Table, str | None]:
    """The requests both points served ok, joined on request_id (``<metric>_base``, ``<metric>_cand`` for e2e, ttft,
    tpot and decode_tok_s) in request_id order, and the note on incomplete inputs (None when complete)."""
    (a, why_a, distinct_a), (b, why_b, distinct_b) = _per_request(base), _per_request(cand)
    note = _inputs_note((base, why_a), (cand, why_b))
    if distinct_a and distinct_b:
        # Each id once on each side: the inner join in request_id order is base's rows (sorted already) that cand
        # has, beside cand's row of the same id; a lookup of cand's ids, not a hash join and a sort of its result.
        at = pc.index_in(a["request_id"], value_set=b["request_id"].combine_chunks())
        hit = pc.is_valid(at)
        a_rows, b_rows = a.filter(hit), b.take(at.filter(hit))
        cols = {"request_id": a_rows["request_id"]}
        cols |= {f"{c}_base": a_rows[c] for c in a.column_names[1:]}
        cols |= {f"{c}_cand": b_rows[c] for c in b.column_names[1:]}
        return pa.table(cols), note
    j = a.join(b, "request_id", left_suffix="_base", right_suffix="_cand", join_type="inner")
    # Arrow's hash join emits rows in a thread-dependent order; the bootstrap indexes by position, so without a fixed
    # order the same --seed would draw different resamples and print a different interval on every call.
    return (j.sort_by("request_id") if j.num_rows else j), note
