"""Metric definitions: the one place the rig says what each number means (the README quotes this docstring).

Every metric is computed from the per-request Parquet records (``rig.results.REQUEST_SCHEMA``) of one point.
Latency metrics use requests with ``ok`` true; times are seconds.

- **TTFT** = first non-empty chunk − send (column ``ttft_s``, measured on the generator's monotonic clock;
  ``first_token_ts − send_ts`` when the column is null).
- **E2E** = end of stream − send (``e2e_s``; ``end_ts − send_ts`` when null).
- **TPOT** = (E2E − TTFT) / (completion_tokens − 1), for requests with more than one completion token.
- **ITL** = each gap between consecutive non-empty chunks divided over the tokens in the later chunk
  (``chunk_offsets_s``, ``chunk_tokens``): a chunk of k tokens that arrived g seconds after the previous one
  contributes k values of g/k. The first chunk is TTFT, not ITL. Percentiles are over tokens.
- **Per-request tok/s** = completion_tokens / E2E, averaged over requests (the campaign's
  "per-request tok/s"). It includes time queued in the server.
- **Decode tok/s** = (completion_tokens − 1) / (E2E − TTFT) = 1 / TPOT, averaged over requests. It excludes
  queueing and prefill, so it is the speed a user sees once tokens flow; at high concurrency per-request tok/s
  from send cannot match the campaign's numbers (Little's law), decode tok/s can.
- **Tokens** = Σ completion_tokens of ok requests (token counts come from the server, never re-tokenized).
- **Wall time** = last end − first send over all written requests of the point and all its generators, each
  timestamp first put on the driver's clock: driver time = ts − clock_offset_s (offset = generator clock − driver
  clock; the row's value, else the manifest's for that generator, else 0).
- **Aggregate tok/s** = Tokens / Wall time.
- **Acceptance length** (tokens per verify step, bonus token included) = Σ completion_tokens / Σ spec_verify_ct over
  ok requests that report spec_verify_ct (token-weighted across requests). Engines that report only counters:
  the manifest's ``window_acceptance`` (counter deltas over the point's window), else the same deltas from the
  scraped ``server_metrics`` (SGLang: Δgeneration_tokens / Δspec_verify_calls; vLLM: 1 + Δaccepted / Δdrafts).
- **Open loop**: latency is also reported from the intended send time (``e2e_from_intended_s``; TTFT from
  intended = TTFT + slip), which counts the time a late client held the request (coordinated omission), and
  schedule slip = actual − intended send is summarised by percentiles.
- **Goodput** under SLOs (e.g. ttft ≤ 500 ms and tpot ≤ 50 ms): a request is good if it is ok and meets every
  SLO (a request with one token has no TPOT and passes a TPOT SLO). Fraction = good / (ok + failed + cancelled
  after it was sent: a request cut off at a level's end was not served within any SLO; one never sent ran for no
  time and is left out), goodput req/s = good / Wall time, goodput tok/s = Σ completion_tokens of good / Wall time.
- **Percentiles** are numpy's linear interpolation (``np.percentile``), reported as p50, p90, p95, p99 and mean.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rig.contracts import GoodputRow

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)

# Columns the per-point metrics read (never the chunk lists: those are read only for ITL).
REQUEST_COLUMNS: list[str] = [
    "ok",
    "status",
    "generator",
    "clock_offset_s",
    "request_id",
    "intended_send_ts",
    "send_ts",
    "first_token_ts",
    "end_ts",
    "ttft_s",
    "e2e_s",
    "slip_s",
    "e2e_from_intended_s",
    "completion_tokens",
    "spec_verify_ct",
]
ITL_COLUMNS: list[str] = ["chunk_offsets_s", "chunk_tokens"]


def as_float(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A numeric Arrow column as float64 numpy with NaN for nulls."""
    arr = pc.cast(col, pa.float64())
    return np.asarray(arr.to_numpy(zero_copy_only=False) if isinstance(arr, pa.Array) else arr.to_numpy(), dtype=float)


def as_bool(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A boolean Arrow column as numpy, nulls false."""
    return np.asarray(pc.fill_null(col, False).to_numpy(zero_copy_only=False), dtype=bool)


@dataclass
class Requests:
    """Per-request metric arrays of one point (one element per written row)."""

    ok: np.ndarray
    cancelled: np.ndarray
    tokens: np.ndarray  # completion_tokens (NaN if unknown)
    ttft: np.ndarray
    e2e: np.ndarray
    send: np.ndarray  # driver clock
    end: np.ndarray  # driver clock
    slip: np.ndarray
    e2e_from_intended: np.ndarray
    verify_ct: np.ndarray
    # status and error of the rows whose status is not ok, when the reader kept them (rig.analysis.points.top_errors)
    failures: pa.Table | None = None

    @property
    def n(self) -> int:
        return len(self.ok)

    @cached_property  # computed once: the report's sections read it several times (never written to)
    def tpot(self) -> np.ndarray:
        """(E2E − TTFT) / (completion_tokens − 1); NaN when fewer than two tokens."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.tokens > 1, (self.e2e - self.ttft) / (self.tokens - 1), np.nan)

    @cached_property  # computed once: the report's sections read it several times (never written to)
    def per_request_tok_s(self) -> np.ndarray:
        """completion_tokens / E2E."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.e2e > 0, self.tokens / self.e2e, np.nan)

    @cached_property  # computed once: the report's sections read it several times (never written to)
    def decode_tok_s(self) -> np.ndarray:
        """(completion_tokens − 1) / (E2E − TTFT) = 1/TPOT."""
        dec = self.e2e - self.ttft
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where((self.tokens > 1) & (dec > 0), (self.tokens - 1) / dec, np.nan)

    def decode_left_out(self) -> tuple[int, int]:
        """Ok requests Decode tok/s leaves out: those with E2E == TTFT (every token in the first chunk: no decode
        time to divide by) and those with fewer than two tokens (no decode phase)."""
        one_chunk = self.ok & (self.tokens > 1) & ~(self.e2e - self.ttft > 0)
        few = self.ok & ~(self.tokens > 1)
        return int(one_chunk.sum()), int(few.sum())

    @property
    def ttft_from_intended(self) -> np.ndarray:
        """TTFT counted from the intended send time (open loop)."""
        return self.ttft + np.nan_to_num(self.slip, nan=0.0)


def requests_from_table(table: pa.Table, offsets_by_generator: dict[int, float] | None = None) -> Requests:
    """Derive the per-request arrays from a table with ``REQUEST_COLUMNS``."""
    offset = as_float(table["clock_offset_s"])
    if offsets_by_generator and np.isnan(offset).any():
        # Few generators: map through the unique ids, not per row.
        uniq, inv = np.unique(as_float(table["generator"]), return_inverse=True)
        fallback = np.array([offsets_by_generator.get(int(g), 0.0) if np.isfinite(g) else 0.0 for g in uniq])
        offset = np.where(np.isnan(offset), fallback[inv.ravel()], offset)
    offset = np.nan_to_num(offset, nan=0.0)
    send_ts = as_float(table["send_ts"])
    first_ts = as_float(table["first_token_ts"])
    end_ts = as_float(table["end_ts"])
    ttft = as_float(table["ttft_s"])
    ttft = np.where(np.isnan(ttft), first_ts - send_ts, ttft)
    e2e = as_float(table["e2e_s"])
    e2e = np.where(np.isnan(e2e), end_ts - send_ts, e2e)
    # A failed request may lack end_ts; it still occupied the client until send + e2e.
    end_ts = np.where(np.isnan(end_ts), send_ts + e2e, end_ts)
    status = table["status"]
    return Requests(
        ok=as_bool(table["ok"]),
        cancelled=as_bool(pc.equal(status, "cancelled")),
        tokens=as_float(table["completion_tokens"]),
        ttft=ttft,
        e2e=e2e,
        send=send_ts - offset,
        end=end_ts - offset,
        slip=as_float(table["slip_s"]),
        e2e_from_intended=as_float(table["e2e_from_intended_s"]),
        verify_ct=as_float(table["spec_verify_ct"]),
    )


def window(r: Requests) -> tuple[float | None, float | None, float | None]:
    """(first send, last end, wall seconds) on the driver's clock over every written request."""
    if r.n == 0 or np.all(np.isnan(r.send)):
        return None, None, None
    start = float(np.nanmin(r.send))
    end = float(np.nanmax(r.end)) if not np.all(np.isnan(r.end)) else None
    return start, end, (end - start) if end is not None else None


def total_tokens(r: Requests) -> int:
    """Σ completion_tokens over ok requests."""
    return int(np.nansum(r.tokens[r.ok]))


def aggregate_tok_s(tokens: int, wall_s: float | None) -> float | None:
    """Tokens / wall time."""
    return tokens / wall_s if wall_s and wall_s > 0 else None


def nanmean(x: np.ndarray) -> float | None:
    """Mean of the finite values, None if there are none."""
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else None


def acceptance_from_requests(r: Requests) -> float | None:
    """Token-weighted acceptance length Σ tokens / Σ spec_verify_ct over ok requests that report verify counts."""
    m = r.ok & (r.verify_ct > 0) & np.isfinite(r.tokens)
    if not m.any():
        return None
    return float(r.tokens[m].sum() / r.verify_ct[m].sum())


def acceptance_decode_only(r: Requests) -> float | None:
    """Acceptance as SGLang's own tools print it: Σ (completion_tokens - 1) / Σ spec_verify_ct, the tokens the verify
    steps committed, without each request's first token (sampled by the prefill, no verify). bench_serving's
    "Accept length" is /server_info internal_states[0].avg_spec_accept_length = accepted tokens / verify forwards
    counted in decode batches (managers/scheduler_components/metrics_reporter.py; benchmark/serving.py)."""
    m = r.ok & (r.verify_ct > 0) & np.isfinite(r.tokens) & (r.tokens >= 1)
    if not m.any():
        return None
    return float((r.tokens[m] - 1).sum() / r.verify_ct[m].sum())


def acceptance_from_counters(engine: str | None, before: dict[str, float], after: dict[str, float]) -> float | None:
    """Acceptance length from counter deltas; the engine adapter knows its counter names and formula."""
    from rig.server.engines import ENGINES

    order = [engine] if engine in ENGINES else []
    order += [e for e in ("sglang", "vllm") if e not in order]
    for name in order:
        got = ENGINES[name].window_acceptance(before, after)
        if got is not None and got.accept_length is not None:
            return float(got.accept_length)
    return None


def _lengths(lists: pa.Array, null: int) -> np.ndarray:
    """Each list's length as int64 numpy, ``null`` for a null list."""
    return np.asarray(pc.fill_null(pc.list_value_length(lists), null).to_numpy(zero_copy_only=False), dtype=np.int64)


def _counts(flat: pa.Array) -> np.ndarray:
    """Chunk token counts as integers (exact, half the memory of floats), or floats with NaN where one is null."""
    if flat.null_count == 0 and pa.types.is_integer(flat.type):
        return np.asarray(flat.to_numpy(zero_copy_only=False))
    return as_float(flat)


def itl_values(
    offsets: pa.ChunkedArray | pa.Array, tokens: pa.ChunkedArray | pa.Array, rows: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """ITL values and their token weights from chunk offset and chunk token lists (one entry per later chunk), over
    the rows where ``rows`` is true (all when None). Works on the flattened lists with masks: no list is copied.
    Weights are integers when every count is known (exact as floats: the sums and percentiles do not change)."""
    if isinstance(offsets, pa.ChunkedArray):
        offsets = offsets.combine_chunks() if offsets.num_chunks else pa.array([], offsets.type)
    if isinstance(tokens, pa.ChunkedArray):
        tokens = tokens.combine_chunks() if tokens.num_chunks else pa.array([], tokens.type)
    if len(offsets) == 0:
        return np.empty(0), np.empty(0)
    n_off = _lengths(offsets, 0)
    n_tok = _lengths(tokens, -1)
    # Lists of unequal length cannot be paired chunk by chunk; without token counts each chunk counts one token.
    no_tok = n_tok == -1
    keep = (n_off == n_tok) | no_tok
    if rows is not None:
        keep &= rows
    flat = as_float(pc.list_flatten(offsets))  # the elements of every non-null list, row after row
    sel = np.repeat(keep, n_off) if not keep.all() else np.ones(flat.size, dtype=bool)
    sel[(np.cumsum(n_off) - n_off)[n_off > 0]] = False  # a list's first chunk is TTFT, not ITL
    # Token counts aligned with flat offsets; rows without counts get one token per chunk.
    with_tok = keep & ~no_tok
    if (np.maximum(n_tok, 0) == n_off).all():  # every row's counts pair with its offsets (the usual case)
        tok = _counts(pc.list_flatten(tokens))
    else:
        tok_flat = _counts(pc.list_flatten(tokens)) if with_tok.any() else np.empty(0, np.int64)
        tok = np.ones(flat.size, dtype=tok_flat.dtype)
        if with_tok.any():
            tok[np.repeat(with_tok, n_off)] = tok_flat[np.repeat(with_tok, np.maximum(n_tok, 0))]
    gaps = np.empty_like(flat)  # np.diff without its two temporaries (a 100 M-record point has 20 M chunks)
    gaps[:1] = np.nan
    np.subtract(flat[1:], flat[:-1], out=gaps[1:])
    gaps, tok = gaps[sel], tok[sel]
    good = np.isfinite(gaps) & (tok > 0)
    if good.all():  # the usual case: no third copy of either array
        gaps /= tok
        return gaps, tok
    return gaps[good] / tok[good], tok[good]


def sort_weighted(values: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Finite values with positive weight, sorted by value (with their weights): sort once, query many times."""
    v = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    m = np.isfinite(v) & (w > 0)
    v, w = v[m], w[m]
    order = np.argsort(v)  # ties are equal values: their order cannot change a percentile
    return v[order], w[order]


def percentiles_of(fin: np.ndarray, q: np.ndarray) -> np.ndarray:
    """np.percentile(fin, q) (linear), reordering ``fin`` (a copy the caller owns): sorted first, since numpy's sort
    (vectorised) is faster than the selection np.percentile makes (np.partition at a list of kth, ~3x slower at
    200 k values), and a percentile reads only order statistics: the same numbers (a NaN sorts last, where numpy's
    selection puts it: NaN either way)."""
    fin.sort()
    return np.asarray(np.percentile(fin, q, overwrite_input=True))


_SELECT_MAX_QS = 8  # up to this many percentiles are selected (order_statistics), more (a CDF) sort once
_EXPAND_MAX = 200_000_000  # integer weights summing to at most this are expanded for selection (8 bytes each)


def order_statistics(a: np.ndarray, ks: Iterable[int]) -> dict[int, float]:
    """The k-th smallest values of ``a`` (0-based) for each k, reordering ``a`` in place: one single-kth np.partition
    per k, smallest first, each over the part right of the previous one (numpy's partition at one kth is vectorised;
    at a list of kth it is slower than a sort; the upper percentiles select among few values). The values are exactly
    those a sort would put at the ks."""
    out: dict[int, float] = {}
    start = 0  # a[:start] holds the start smallest values, in place
    for k in sorted(set(ks)):
        if k == start:  # the smallest of what is left (p0, or the upper neighbour of the last k): no partition
            low = start + int(np.argmin(a[start:]))
            a[low], a[k] = a[k], a[low]
        else:
            a[start:].partition(k - start)  # a[start:k] <= a[k] <= a[k + 1 :]
        out[k] = float(a[k])
        start = k + 1
    return out


def _expanded_percentiles(v: np.ndarray, w: np.ndarray, total: Any, q: np.ndarray) -> list[float | None]:
    """weighted_percentiles by selection: the values repeated by their (integer) weights, only the order statistics
    the percentiles need put in place (order_statistics, linear time) instead of a sort of every value; the same
    order statistics and the same interpolation as the sorted path, so the same numbers."""
    h = (total - 1) * q / 100.0
    lo, hi = np.floor(h), np.ceil(h)
    expanded = np.repeat(v, w.astype(np.int64)) if total != v.size else v.copy()  # all ones: nothing to repeat
    at = order_statistics(expanded, np.concatenate([lo, hi]).astype(np.int64).tolist())
    v_lo = np.array([at[int(k)] for k in lo])
    v_hi = np.array([at[int(k)] for k in hi])
    return [float(x) for x in v_lo + (h - lo) * (v_hi - v_lo)]


def weighted_percentiles(
    values: np.ndarray, weights: np.ndarray | None, qs: Iterable[float], presorted: bool = False
) -> list[float | None]:
    """Percentiles of ``values`` each repeated ``weights`` times, exactly as np.percentile(linear) on that array.

    ``presorted``: values and weights come from ``sort_weighted`` already. A few percentiles of integer weights (token
    counts) are found by selection, without sorting (see _expanded_percentiles).
    """
    q = np.asarray(list(qs), dtype=float)
    if weights is None:
        v = np.asarray(values, dtype=float)
        v = v[np.isfinite(v)]  # a copy: sorted in place
        return [float(x) for x in percentiles_of(v, q)] if v.size else [None] * q.size
    if not presorted and q.size <= _SELECT_MAX_QS:
        v, w = np.asarray(values, dtype=float), np.asarray(weights)
        keep = np.isfinite(v) & (w > 0)
        if not keep.all():
            v, w = v[keep], w[keep]
        if not v.size:
            return [None] * q.size
        total = w.sum()  # exact for integer weights, whatever their dtype
        if total <= _EXPAND_MAX and (w.dtype.kind in "iu" or np.array_equal(w, np.floor(w))):
            return _expanded_percentiles(v, w, total, q)
    v, w = (
        (np.asarray(values, dtype=float), np.asarray(weights, dtype=float))
        if presorted
        else sort_weighted(values, weights)
    )
    if not v.size:
        return [None] * q.size
    cw = np.cumsum(w)
    h = (cw[-1] - 1) * q / 100.0
    lo, hi = np.floor(h), np.ceil(h)
    # Expanded index k lies in the first run whose cumulative weight exceeds k.
    v_lo = v[np.minimum(np.searchsorted(cw, lo, side="right"), v.size - 1)]
    v_hi = v[np.minimum(np.searchsorted(cw, hi, side="right"), v.size - 1)]
    return [float(x) for x in v_lo + (h - lo) * (v_hi - v_lo)]


@dataclass(frozen=True)
class Summary:
    """n, mean and the standard percentiles (PERCENTILES) of a metric's finite values; None where there are none."""

    n: int
    mean: float | None
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None

    def stat(self, key: str) -> float | None:
        """``mean`` or ``pNN`` by name."""
        value: float | None = getattr(self, key)
        return value


def summarize(values: np.ndarray, weights: np.ndarray | None = None, presorted: bool = False) -> Summary:
    """n, mean and the standard percentiles of the finite values (weighted: as if each repeated weight times)."""
    v = np.asarray(values, dtype=float)
    if weights is None:
        fin = v[np.isfinite(v)]  # a copy of its own: the percentiles may reorder it in place
        n, mean = int(fin.size), (float(fin.mean()) if fin.size else None)
        q = np.asarray(PERCENTILES, dtype=float)
        got = [float(x) for x in percentiles_of(fin, q)] if fin.size else [None] * q.size
        return Summary(n, mean, **{f"p{k}": x for k, x in zip(PERCENTILES, got, strict=True)})
    w = np.asarray(weights)  # integer weights stay integers: v * w and the sums are the same as in floats
    m = np.isfinite(v) & (w > 0)
    vm, wm = (v, w) if m.all() else (v[m], w[m])  # the same values in the same order: the same sums
    n = int(wm.sum())
    mean = float((vm * wm).sum() / wm.sum()) if m.any() else None
    pcts = weighted_percentiles(v, weights, PERCENTILES, presorted)
    return Summary(n, mean, **{f"p{q}": x for q, x in zip(PERCENTILES, pcts, strict=True)})


# --- SLOs and goodput ---------------------------------------------------------------------------------------------

SLO_METRICS = ("ttft", "tpot", "e2e")
_UNITS = {"ms": 1e-3, "s": 1.0, "us": 1e-6, "": 1e-3}  # a bare number is milliseconds, as genai-perf's goodput


@dataclass(frozen=True)
class Slo:
    """One service-level objective: ``metric`` (ttft | tpot | e2e) must be ≤ ``limit_s``."""

    metric: str
    limit_s: float

    def __str__(self) -> str:
        return f"{self.metric}<={self.limit_s * 1e3:g}ms"


def parse_slo(text: str) -> Slo:
    """Parse ``ttft=500ms`` / ``tpot=0.05s`` / ``e2e=20s`` (bare numbers are ms); ValueError on bad input."""
    m = re.fullmatch(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*[=:]\s*([0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*(ms|s|us)?\s*", text)
    if not m:
        raise ValueError(f"bad SLO {text!r}: expected METRIC=VALUE[ms|s], e.g. ttft=500ms")
    metric = m.group(1).lower()
    if metric not in SLO_METRICS:
        raise ValueError(f"bad SLO {text!r}: metric must be one of {', '.join(SLO_METRICS)}")
    limit = float(m.group(2)) * _UNITS[m.group(3) or ""]
    if limit <= 0:  # nothing meets a zero limit, and a margin is relative to it (a division by zero)
        raise ValueError(f"bad SLO {text!r}: the limit must be above 0")
    return Slo(metric, limit)


def goodput(r: Requests, slos: list[Slo], wall_s: float | None) -> GoodputRow:
    """Requests meeting every SLO: count, fraction of ok+failed+sent cancelled, rate and token rate over wall time."""
    values = {"ttft": r.ttft, "tpot": r.tpot, "e2e": r.e2e}
    good = r.ok.copy()
    for s in slos:
        v = values[s.metric]
        # No TPOT (one token) passes; a missing TTFT/E2E on an ok request cannot be shown to meet the SLO.
        passes = np.isnan(v) if s.metric == "tpot" else np.zeros(r.n, dtype=bool)
        with np.errstate(invalid="ignore"):
            good &= (v <= s.limit_s) | passes
    # a cancelled request that was sent is an SLO failure (leaving it out showed 100 % beside 174 cancelled)
    sent_cancelled = r.cancelled & ~r.ok & (np.nan_to_num(r.e2e, nan=0.0) > 0)
    denom = int((~r.cancelled | r.ok | sent_cancelled).sum())
    n_good = int(good.sum())
    tokens = int(np.nansum(r.tokens[good]))
    return GoodputRow.make(
        slos=", ".join(str(s) for s in slos),
        good=n_good,
        counted=denom,
        fraction=n_good / denom if denom else None,
        goodput_req_s=n_good / wall_s if wall_s else None,
        goodput_tok_s=tokens / wall_s if wall_s else None,
    )
