"""Per-point numbers: read a point's records once and derive its campaign row, acceptance and flags.

Validity (a saturated client, a slipped schedule, a lost generator) is the run's verdict, judged once by
rig.contracts.judge_point and read from the manifest; this adds what the records on disk show (missing or
unreadable parts, failures, a point that did not complete)."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pyarrow.compute as pc

from rig.analysis import metrics as m
from rig.analysis.runs import PointInfo, Run, generator_offsets, read_point_requests
from rig.analysis.server_series import Series, counter_window_acceptance, point_series
from rig.contracts import CampaignRow, ErrorCount, GeneratorReport, achieved_rate

# Flags that make a point's numbers unfit for comparison (the others are notes).
INVALIDATING = frozenset(
    {
        "client_saturated",
        "sim_behind",
        "generator_lost",
        "schedule_slip",
        "no_rows",
        "missing_rows",
        "partial",
        "failed",
        "interrupted",
        "pending",
        "running",
        "generator_partial",
        "generator_failed",
        "status_unknown",
        "unreadable_parts",
        "missing_parts",
        "dataset_exhausted",  # a duration-bound level whose sessions ran out: its load fell away before it ended
    }
)
# Flags saying the point's records on disk are not all of what it took (a comparison over them is incomplete).
INCOMPLETE = frozenset(
    {
        "no_rows",
        "missing_rows",
        "unreadable_parts",
        "missing_parts",
        "partial",
        "failed",
        "interrupted",
        "pending",
        "running",
        "generator_lost",
        "generator_partial",
        "generator_failed",
        "generator_interrupted",
        "status_unknown",
        "not_in_manifest",
    }
)


# What load_requests reads: the metric columns, without request_id (the strings cost as much as all the rest), and
# the error messages (null but on failed rows: nearly free), kept for top_errors so that it reads nothing again.
_METRIC_COLUMNS = [c for c in m.REQUEST_COLUMNS if c != "request_id"] + ["error"]


def load_requests(run: Run, p: PointInfo) -> m.Requests:
    """The point's per-request metric arrays (all written rows); read once for the report's later sections too."""

    def read() -> m.Requests:
        table = read_point_requests(run.run_dir, p.point, _METRIC_COLUMNS, on_skip=run.skipped(p))
        r = m.requests_from_table(table, generator_offsets(run.manifest))
        r.failures = table.select(["status", "error"]).filter(pc.not_equal(table["status"], "ok"))
        return r

    return run.memo("requests", p.point, read)


def acceptance(
    run: Run, p: PointInfo, r: m.Requests, series: dict[str, Series] | None = None
) -> tuple[float | None, str | None]:
    """(acceptance length, source): per-request fields, else the manifest's counter window, else scraped counters."""
    per_req = m.acceptance_from_requests(r)
    if per_req is not None:
        return per_req, "requests"
    wa = p.window_acceptance
    if wa is not None and wa.accept_length is not None:
        return float(wa.accept_length), "manifest_window"
    s = series if series is not None else point_series(run, p.point)
    got = counter_window_acceptance(p.engine, s)
    return (got, "server_counters") if got is not None else (None, None)


def point_flags(p: PointInfo, r: m.Requests) -> list[str]:
    """The run's verdict plus what the rows and the point's status show; sorted, no duplicates."""
    return sorted(flag_reasons(p, r))


def _gen_name(g: GeneratorReport) -> str:
    return f"generator {g.generator}"


def flag_reasons(p: PointInfo, r: m.Requests) -> dict[str, str]:
    """Each flag of the point with the figure that tripped it (one short phrase)."""
    why: dict[str, str] = {f: p.flag_reasons.get(f) or "set by the run (see the manifest)" for f in p.flags}
    if p.status is None:
        why["status_unknown"] = "the manifest has no status for this point"
    elif p.status != "complete":
        why[str(p.status)] = f"point status {p.status}"
    if not p.in_manifest:
        why["not_in_manifest"] = "rows on disk for a point the manifest does not list"
    if p.unreadable_parts:
        why["unreadable_parts"] = f"{len(p.unreadable_parts)} part file(s) unreadable (cut short or damaged)"
    if p.missing_parts:
        why["missing_parts"] = f"{len(p.missing_parts)} part file(s) the manifest lists are gone"
    if r.n == 0:
        why["no_rows"] = "no request records on disk"
    elif p.requests_scheduled is not None and r.n < int(p.requests_scheduled):
        why["missing_rows"] = f"{r.n:,} rows on disk of {int(p.requests_scheduled):,} scheduled"
    failed = int((~r.ok & ~r.cancelled).sum()) if r.n else 0
    if failed:
        why["has_failures"] = f"{failed:,} of {r.n:,} requests failed"
    cancelled = int((r.cancelled & ~r.ok).sum()) if r.n else 0
    if cancelled:  # a note: they are left out of percentiles and SLO verdicts unless counted at their lower bound
        why["has_cancelled"] = f"{cancelled:,} of {r.n:,} requests cancelled"
    one_chunk, few = r.decode_left_out() if r.n else (0, 0)
    if one_chunk or few:  # a note: the Decode tok/s column is the mean of the others
        parts = [f"{one_chunk:,} with E2E == TTFT (every token in the first chunk)"] if one_chunk else []
        parts += [f"{few:,} with fewer than two tokens"] if few else []
        why["decode_left_out"] = f"Decode tok/s leaves out {one_chunk + few:,} of {int(r.ok.sum()):,} ok requests: " + (
            ", ".join(parts)
        )
    for g in p.generators:
        if g.status and g.status != "complete":
            why[f"generator_{g.status}"] = f"{_gen_name(g)}: {g.error or g.status}"
    return dict(sorted(why.items()))


_NOISE = re.compile(r"\b(?=[0-9a-f-]*\d)[0-9a-f-]{8,}\b")  # request ids, hashes: one message, not thousands


def top_errors(run: Run, p: PointInfo, limit: int = 3, r: m.Requests | None = None) -> list[ErrorCount]:
    """The point's most frequent error messages (failed and cancelled requests) with their counts (from ``r`` when
    load_requests kept them)."""
    t = r.failures if r is not None and r.failures is not None else None
    if t is None:
        t = read_point_requests(
            run.run_dir, p.point, ["status", "error"], filter=pc.field("status") != "ok", on_skip=run.skipped(p)
        )
    counts: Counter[tuple[str, str]] = Counter()
    for status, err in zip(t["status"].to_pylist(), t["error"].to_pylist(), strict=True):
        counts[(status, _NOISE.sub("…", (err or "no message").strip())[:160])] += 1
    return [ErrorCount.make(status=st, error=msg, count=n) for (st, msg), n in counts.most_common(limit)]


def campaign_row(run: Run, p: PointInfo, r: m.Requests, series: dict[str, Series] | None = None) -> CampaignRow:
    """One row of the campaign table (see rig.analysis.metrics for every definition)."""
    start, end, wall = m.window(r)
    tokens = m.total_tokens(r)
    ok = int(r.ok.sum())
    cancelled = int((r.cancelled & ~r.ok).sum())
    accept, source = acceptance(run, p, r, series)
    reasons = flag_reasons(p, r)
    achieved = None
    if p.open_loop and r.n > 1:
        sends = r.send[np.isfinite(r.send)]
        if sends.size > 1:
            achieved = achieved_rate(int(sends.size), float(sends.min()), float(sends.max()))
    return CampaignRow.make(
        point=p.point,
        server_config=p.server_config,
        engine=p.engine,
        steps=p.steps,
        workload=p.workload,
        load_mode=p.load_mode,
        concurrency=p.concurrency,
        rate=p.rate,
        achieved_rate=achieved,
        repeat=p.repeat,
        status=p.status,
        requests=r.n,
        aggregate_tok_s=m.aggregate_tok_s(tokens, wall),
        per_request_tok_s=m.nanmean(r.per_request_tok_s[r.ok]),
        decode_tok_s=m.nanmean(r.decode_tok_s[r.ok]),
        tokens=tokens,
        wall_s=wall,
        first_send_ts=start,
        last_end_ts=end,
        ok=ok,
        failed=r.n - ok - cancelled,
        cancelled=cancelled,
        accept_length=accept,
        accept_source=source,
        flags=sorted(reasons),
        flag_reasons=reasons,
        error=p.error,
        errors=top_errors(run, p, r=r) if ok < r.n else [],
    )


def sort_key(row: CampaignRow) -> tuple:
    """Table order: configuration (by steps), workload, load level, repeat."""
    level = row.level
    return (
        row.steps if row.steps is not None else -1,
        str(row.server_config or ""),
        str(row.workload or ""),
        str(row.load_mode or ""),
        level if level is not None else float("inf"),
        row.repeat or 0,
        row.point,
    )
