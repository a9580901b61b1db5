"""The speculative steps a server actually ran over a point, from its ``sglang:spec_num_steps`` gauge: an adaptive
server (SGLang ``--speculative-adaptive``) switches tiers by itself, so its startup steps say little.

Per point: the time-weighted mean, min and max of the active steps, the number of switches and the time in each
tier. The gauge is a step function: each scraped value holds until the next scrape (the last one closes the
point). SGLang sets it at its decode log (metrics_reporter.py, every ``--decode-log-interval`` batches, 40 by
default), so a switch shows from the next decode log on.

Per tier: acceptance and throughput over the **scrape windows** that lie wholly in one tier (the gauge read the
same at both ends): accept length = Δ``sglang:generation_tokens_total`` / Δ``sglang:spec_verify_calls_total`` (tokens
per verify: right under adaptive), throughput = Δgeneration tokens / Δt. Windows whose ends read different tiers
are counted as mixed and left out of the per-tier figures (a switch there cannot be placed in time); a switch and
back inside one window is not seen. SGLang's ``spec_accept_rate`` divides accepted drafts by the *startup* draft
count (its tokenizer manager), so under adaptive it is wrong once the tier changes: rig reports the accept length
instead and never that rate.
"""

from __future__ import annotations

import numpy as np

from rig.analysis.metrics import acceptance_from_counters
from rig.analysis.rows import ActiveStepsRow, TierRow
from rig.analysis.server_series import COUNTERS, Series

GENERATED = "sglang:generation_tokens_total"
ACCEPT_RATE_NOTE = (
    "acceptance under adaptive is the accept length (tokens per verify, from the server's counters): SGLang's "
    "spec_accept_rate divides by the startup draft count, wrong once the tier changes, so rig does not report it"
)


def _at(series: Series, ts: np.ndarray) -> np.ndarray:
    """The counter's value at each of ``ts`` (NaN where that scrape lacks it)."""
    out = np.full(ts.size, np.nan)
    if series.empty:
        return out
    idx = np.searchsorted(series.ts, ts)
    ok = (idx < series.ts.size) & (series.ts[np.minimum(idx, series.ts.size - 1)] == ts)
    out[ok] = series.values[idx[ok]]
    return out


def _tier_rows(
    engine: str | None, steps: Series, counters: dict[str, Series], durations: np.ndarray
) -> tuple[list[TierRow], int]:
    """Per tier: time, windows wholly in it and their acceptance and throughput; and the mixed windows' count."""
    ts, v = steps.ts, steps.values
    same = v[:-1] == v[1:]  # window i: (ts[i], ts[i+1]]
    at = {n: _at(counters[n], ts) for n in COUNTERS if not counters[n].empty}
    total = float(durations.sum())
    rows = []
    for tier in sorted({int(x) for x in v}):
        inside = same & (v[:-1] == tier)
        deltas = {n: float(np.nansum((a[1:] - a[:-1])[inside])) for n, a in at.items()}
        span = float(durations[inside].sum())
        gen = deltas.get(GENERATED)
        rows.append(
            TierRow(
                tier=tier,
                seconds=float(durations[v[:-1] == tier].sum()),
                share=float(durations[v[:-1] == tier].sum()) / total if total > 0 else 0.0,
                windows=int(inside.sum()),
                accept_length=acceptance_from_counters(engine, dict.fromkeys(deltas, 0.0), deltas)
                if inside.any() and deltas
                else None,
                gen_tok_s=gen / span if gen is not None and span > 0 and inside.any() else None,
            )
        )
    return rows, int((~same).sum())


def active_steps(
    point: str,
    engine: str | None,
    startup_steps: int | None,
    adaptive: str | None,
    series: dict[str, Series],
) -> ActiveStepsRow | None:
    """The point's active steps over time, None when its server published no spec_num_steps gauge."""
    steps = series.get("spec_steps")
    if steps is None or steps.empty:
        return None
    v = steps.values
    durations = np.diff(steps.ts)
    span = float(durations.sum())
    mean = float(np.sum(v[:-1] * durations) / span) if span > 0 else float(v[0])
    tiers, mixed = _tier_rows(engine, steps, series, durations) if v.size > 1 else ([], 0)
    return ActiveStepsRow(
        point=point,
        startup_steps=startup_steps,
        adaptive=adaptive,
        samples=int(v.size),
        span_s=span,
        mean=mean,
        min=int(v.min()),
        max=int(v.max()),
        switches=int(np.count_nonzero(v[1:] != v[:-1])),
        mixed_windows=mixed,
        tiers=tiers,
    )


def worth_showing(rows: list[ActiveStepsRow]) -> bool:
    """Any point is adaptive, or ran other steps than it was labelled with (a fixed point's gauge that moved)."""
    return any(r["adaptive"] or r["switches"] or r["min"] != r["startup_steps"] for r in rows)
