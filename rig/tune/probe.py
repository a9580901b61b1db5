"""Reading one measured point back as a probe: its SLO verdict and the figures a search or tune reports."""

from __future__ import annotations

from pathlib import Path

from rig.analysis import metrics as m
from rig.analysis.points import INVALIDATING, campaign_row, load_requests
from rig.analysis.runs import load_run, read_point_requests
from rig.analysis.slo import evaluate_slos
from rig.contracts import Probe


def read_probe(run_dir: Path, point: str, slos: list[m.Slo], percentile: float) -> Probe | None:
    """The point's verdict and figures; None when it has no rows (it did not run: e.g. its server did not start)."""
    run = load_run(run_dir)
    p = run.point(point)
    r = load_requests(run, p)
    if r.n == 0:
        return None
    row = campaign_row(run, p, r)
    verdict = evaluate_slos(r, slos, percentile)
    return Probe.make(
        point=point,
        steps=p.steps,
        level=p.level,
        meets=verdict.meets,
        margin=verdict.margin,
        per_slo=verdict.per_slo,
        requests=r.n,
        aggregate_tok_s=row.aggregate_tok_s,
        decode_tok_s=row.decode_tok_s,
        accept_length=row.accept_length,
        flags=row.flags,
        valid=not (set(row.flags) & INVALIDATING),
        mean_ttft_s=m.nanmean(r.ttft[r.ok]),
    )


def output_lengths(run_dir: Path, point: str) -> dict[str, int]:
    """request_id -> completion tokens of the point's ok requests (what the server produced for each)."""
    t = read_point_requests(run_dir, point, ["request_id", "completion_tokens", "ok"])
    return {
        rid: int(n)
        for rid, n, ok in zip(
            t["request_id"].to_pylist(), t["completion_tokens"].to_pylist(), t["ok"].to_pylist(), strict=True
        )
        if ok and n is not None
    }


def slo_texts(slos: list[m.Slo]) -> list[str]:
    """SLOs as text parse_slo reads back (for the manifest, so a resumed search uses the same ones)."""
    return [f"{s.metric}={s.limit_s * 1e3:g}ms" for s in slos]
