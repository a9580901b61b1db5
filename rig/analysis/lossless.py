"""Greedy losslessness: at temperature 0, speculation must not change the output of any request."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rig.analysis.rows import MismatchRow
from rig.analysis.runs import PointInfo, Run, read_point_requests
from rig.contracts import LosslessResult


def comparable_groups(run: Run) -> list[list[PointInfo]]:
    """Points that ran the same requests (workload, load level, repeat) on configurations that differ only in
    speculative knobs; only groups of two or more can disagree."""
    groups: dict[tuple, list[PointInfo]] = defaultdict(list)
    for p in run.points:
        groups[(p.non_speculative_knobs(),) + p.level_key()].append(p)
    return [g for g in groups.values() if len(g) > 1]


def _label(p: PointInfo, group: list[PointInfo]) -> str:
    """steps=N, or the point id when two points of the group share a steps value."""
    same = [q for q in group if q.steps == p.steps]
    return f"steps={p.steps}" if len(same) == 1 else f"{p.point}"


def _codes(col: pa.ChunkedArray) -> tuple[pa.Array, np.ndarray]:
    """The distinct values of a string column (in order of first appearance) and each row's index among them (int64
    numpy): one hashing pass (dictionary_encode gives every chunk the one dictionary of the whole column)."""
    enc = pc.dictionary_encode(col)
    chunks = [c for c in enc.chunks if len(c)]
    uniq = chunks[-1].dictionary if chunks else pa.array([], col.type)
    if any(len(c.dictionary) != len(uniq) for c in chunks):  # not one dictionary: hash the values again
        return uniq, np.asarray(pc.index_in(col, value_set=uniq).to_numpy(), dtype=np.int64)
    return uniq, np.concatenate(
        [np.asarray(c.indices.to_numpy(), dtype=np.int64) for c in chunks] or [np.empty(0, np.int64)]
    )


def not_checked_reason(result: LosslessResult) -> str:
    """Why a check that compared no request checked nothing."""
    if result.groups_checked == 0:
        return "no two points share requests across speculative settings"
    return f"no temperature-0 request in the {result.groups_checked} group(s) of points that share requests"


def check_lossless(run: Run) -> LosslessResult:
    """Every temperature-0 request whose output_hash differs between comparable points, with each point's hash."""
    mismatches: list[dict[str, Any]] = []
    checked = 0
    groups = comparable_groups(run)
    flt = (pc.field("temperature") == 0) & (pc.field("ok") == True) & pc.field("output_hash").is_valid()  # noqa: E712
    for group in groups:
        parts = []
        for pi, p in enumerate(group):
            t = read_point_requests(
                run.run_dir, p.point, ["request_id", "output_hash"], filter=flt, on_skip=run.skipped(p)
            )
            parts.append(t.append_column("pi", pa.array([pi] * t.num_rows, pa.int32())))
        t = pa.concat_tables(parts)
        if t.num_rows == 0:
            continue
        # Strings to integer codes (the distinct values, then each row's place among them), then counting in
        # numpy: a request id with rows in two or more points was checked; one whose rows carry two hash codes
        # mismatches. No copy of the strings is made (a 100 M-record group is 10 M rows of them).
        uniq_ids, codes = _codes(t["request_id"])
        _, hash_codes = _codes(t["output_hash"])
        checked += int((np.bincount(codes, minlength=len(uniq_ids)) > 1).sum())
        one = np.zeros(len(uniq_ids), dtype=hash_codes.dtype)
        one[codes] = hash_codes  # one of each id's hash codes (whichever): a row that differs from it means two
        differ = np.unique(codes[hash_codes != one[codes]])
        if differ.size == 0:
            continue
        bad = uniq_ids.take(pa.array(differ))
        rows = t.filter(pc.is_in(t["request_id"], value_set=bad)).sort_by(
            [("request_id", "ascending"), ("pi", "ascending")]
        )
        by_req: dict[str, dict[str, str]] = defaultdict(dict)
        for rid, h, pi in zip(
            rows["request_id"].to_pylist(), rows["output_hash"].to_pylist(), rows["pi"].to_pylist(), strict=True
        ):
            by_req[rid][_label(group[pi], group)] = h
        p0 = group[0]
        for rid, hashes in by_req.items():
            mismatches.append(
                {
                    "request_id": rid,
                    "workload": p0.workload,
                    "load_mode": p0.load_mode,
                    "concurrency": p0.concurrency,
                    "rate": p0.rate,
                    "repeat": p0.repeat,
                    "points": [q.point for q in group],
                    "steps": sorted({q.steps for q in group}, key=lambda s: (s is None, s)),
                    "hashes": hashes,
                }
            )
    return LosslessResult.make(
        groups_checked=len(groups), requests_checked=checked, mismatches=mismatches, ok=not mismatches
    )


def mismatch_rows(result: LosslessResult) -> list[MismatchRow]:
    """Flat rows (one per mismatching request) for tables and CSV."""
    return [
        {
            "request_id": m["request_id"],
            "workload": m["workload"],
            "concurrency": m["concurrency"],
            "rate": m["rate"],
            "repeat": m["repeat"],
            "steps": ",".join(str(s) for s in m["steps"]),
            "hashes": "; ".join(f"{k}: {v}" for k, v in m["hashes"].items()),
        }
        for m in result.mismatches
    ]
