"""A load profile's point over time: windows of throughput, latency, acceptance, the server's gauges and power, and
per phase the steady-state figures and the time the server took to adapt.

Times are seconds from the point's common start (``start_wall``, driver clock): records are moved onto the driver's
clock by their ``clock_offset_s``, server and GPU samples by the server node's offset (the GPU telemetry's).

- **Windows** of ``window_s`` (default 5 s) from the start to the last record's end. Output tok/s counts the tokens
  of each streamed chunk in the window its chunk arrived (without chunk times: at the request's end); TTFT falls in
  the window of the first token, TPOT and acceptance (completion tokens / verify calls) in the window of the end;
  running requests, active speculative steps (``sglang:spec_num_steps``) and power are the means of the samples in
  the window (power summed over GPUs).
- **Steady state** of a phase: from the first running-requests sample after which the gauge stays within
  ``SETTLE_REL`` (or ``SETTLE_ABS`` requests) of its value over the phase's second half -- or, if later, from when
  the active steps settled (time to adapt, below) -- until the phase ends or the last send, whichever is first (the
  drain after the last send is never steady). Without the running gauge the first window after the change is
  dropped instead. A ramp has no steady state: its figures span the whole phase and say so.
- **Time to adapt** after a change: until the active-steps gauge reaches its new steady value (the median of the
  phase's second half, within 0.5 of a step) and stays there; and until the window tok/s does (within
  ``SETTLE_REL``). None when it never settles inside the phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rig.contracts.profile import LoadPhase

DEFAULT_WINDOW_S = 5.0
SETTLE_REL = 0.15  # a gauge or tok/s within 15 % of its steady value has settled...
SETTLE_ABS = 1.0  # ... or within one request (running requests at low concurrency)
STEPS_TOL = 0.5  # the active-steps gauge is an integer per rank: within half a step is "at" the value


@dataclass(frozen=True)
class Samples:
    """A gauge over time: seconds from the point's start and values (empty: the point has none)."""

    t: np.ndarray
    v: np.ndarray

    @classmethod
    def none(cls) -> Samples:
        return cls(np.empty(0), np.empty(0))


@dataclass(frozen=True)
class Events:
    """What the timeline needs of a point's records, each time on the point's clock (seconds from its start)."""

    send: np.ndarray  # every sent request's send time
    first: np.ndarray  # ok requests: first-token time (nan: none)
    end: np.ndarray  # ok requests: end time
    ttft: np.ndarray  # ok requests
    tpot: np.ndarray  # ok requests: (e2e - ttft) / (tokens - 1), nan for one token
    tokens: np.ndarray  # ok requests: completion tokens
    verify: np.ndarray  # ok requests: verify calls (nan: not reported)
    chunk_t: np.ndarray  # every streamed chunk of an ok request: arrival time
    chunk_n: np.ndarray  # its tokens


@dataclass(frozen=True)
class Window:
    """One window of the timeline."""

    start_s: float
    end_s: float
    phase: int
    sends: int
    output_tok_s: float
    ttft_p50_s: float | None
    tpot_p50_s: float | None
    accept_length: float | None
    running: float | None
    spec_steps: float | None
    power_w: float | None


@dataclass(frozen=True)
class PhaseSummary:
    """One phase: its load, its steady-state span and figures, and the time to adapt after the change into it."""

    phase: int
    label: str
    start_s: float
    end_s: float
    steady_from_s: float | None  # None: no steady span (never settled, or nothing sent)
    steady_to_s: float | None
    excluded: str  # how ramp-up and drain were excluded, in words
    output_tok_s: float | None
    ttft_p50_s: float | None
    tpot_p50_s: float | None
    accept_length: float | None
    running: float | None
    spec_steps: float | None
    power_w: float | None
    steps_adapt_s: float | None  # None on the first phase (no change into it) or when it never settled
    tok_s_adapt_s: float | None


@dataclass(frozen=True)
class Timeline:
    """A profiled point's windows and phases (rig report's timeline section)."""

    point: str
    window_s: float
    windows: list[Window]
    phases: list[PhaseSummary]
    notes: list[str] = field(default_factory=list)


def _mean_in(s: Samples, a: float, b: float) -> float | None:
    sel = (s.t >= a) & (s.t < b) & np.isfinite(s.v)
    return float(np.mean(s.v[sel])) if sel.any() else None


def _median(x: np.ndarray) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else None


def _accept(ev: Events, sel: np.ndarray) -> float | None:
    verify = ev.verify[sel]
    ok = np.isfinite(verify) & (verify > 0)
    return float(ev.tokens[sel][ok].sum() / verify[ok].sum()) if ok.any() else None


def _tokens_in(ev: Events, a: float, b: float) -> float:
    sel = (ev.chunk_t >= a) & (ev.chunk_t < b)
    return float(ev.chunk_n[sel].sum())


def phase_of(phases: list[LoadPhase], t: float) -> int:
    """The index of the phase running at ``t`` seconds from the start (the last one after the profile ends)."""
    starts = [p.start_s or 0.0 for p in phases]
    return max(0, int(np.searchsorted(starts, t, side="right")) - 1)


def windows(
    ev: Events, phases: list[LoadPhase], gauges: dict[str, Samples], window_s: float, until: float
) -> list[Window]:
    """The windows of ``window_s`` from 0 to ``until`` (the last one may be shorter)."""
    starts = [float(a) for a in np.arange(0.0, until, window_s)] or [0.0]
    if len(starts) > 1 and until - starts[-1] < window_s / 2:
        starts.pop()  # a last sliver of the drain joins the window before it (its tok/s would be noise)
    ends = [*starts[1:], max(until, starts[-1] + window_s * 1e-3)]
    out = []
    for a, b in zip(starts, ends, strict=True):
        by_end = (ev.end >= a) & (ev.end < b)
        by_first = (ev.first >= a) & (ev.first < b)
        out.append(
            Window(
                start_s=a,
                end_s=b,
                phase=phase_of(phases, a),
                sends=int(((ev.send >= a) & (ev.send < b)).sum()),
                output_tok_s=_tokens_in(ev, a, b) / (b - a),
                ttft_p50_s=_median(ev.ttft[by_first]),
                tpot_p50_s=_median(ev.tpot[by_end]),
                accept_length=_accept(ev, by_end),
                running=_mean_in(gauges["running"], a, b),
                spec_steps=_mean_in(gauges["spec_steps"], a, b),
                power_w=_mean_in(gauges["power_w"], a, b),
            )
        )
    return out


def settle_time(
    t: np.ndarray, v: np.ndarray, start: float, end: float, abs_tol: float, rel_tol: float, carry: bool = False
) -> float | None:
    """Seconds from ``start`` to the first sample in [start, end) after which every sample of the span stays within
    tolerance of the span's steady value (the median of its second half); None if it never does or has no samples.
    ``carry``: 0 when the last sample before ``start`` was already at that value (nothing had to change)."""
    sel = (t >= start) & (t < end) & np.isfinite(v)
    ts, vs = t[sel], v[sel]
    if ts.size == 0:
        return None
    late = vs[ts >= (start + end) / 2]
    target = float(np.median(late if late.size else vs[-1:]))
    tol = max(abs_tol, rel_tol * abs(target))
    outside = np.flatnonzero(np.abs(vs - target) > tol)
    before = t[(t < start) & np.isfinite(v)]
    if carry and outside.size == 0 and before.size and abs(float(v[t == before.max()][-1]) - target) <= tol:
        return 0.0  # already at the new value when the phase began: nothing to adapt
    if outside.size == 0:
        return float(max(ts[0] - start, 0.0))
    k = int(outside[-1]) + 1
    return float(ts[k] - start) if k < ts.size else None


def _steady_span(
    phase: LoadPhase, end: float, last_send: float, running: Samples, steps: Samples, window_s: float
) -> tuple[float | None, float | None, str]:
    """[from, to) of the phase's steady state and how it was found."""
    start = phase.start_s or 0.0
    to = min(end, last_send)
    if phase.rate_end is not None and phase.rate_end != phase.rate:
        return (start, to, "none: a ramp has no steady state") if to > start else (None, None, "nothing sent")
    if running.t.size:
        settled = settle_time(running.t, running.v, start, end, SETTLE_ABS, SETTLE_REL)
        if settled is None:
            return None, None, "running requests never settled"
        how = f"ramp-up {settled:.1f}s (running settled)"
        adapted = settle_time(steps.t, steps.v, start, end, STEPS_TOL, 0.0, carry=True) if steps.t.size else 0.0
        if adapted is None:
            return None, None, "active steps never settled"
        if adapted > settled:
            settled, how = adapted, f"ramp-up {adapted:.1f}s (active steps settled)"
        frm = start + settled
    else:
        frm, how = start + window_s, f"first {window_s:g}s (no running gauge)"
    if to < end:
        how += f"; drain from {to:.1f}s (last send)"
    return (frm, to, how) if to > frm else (None, None, how + ": nothing left")


def _tok_s_series(ev: Events, a: float, b: float, step: float) -> Samples:
    """Output tok/s in windows of ``step`` over [a, b), stamped at each window's start."""
    starts = np.arange(a, b - step * 0.5, step) if b - a >= step else np.array([a])
    vals = [_tokens_in(ev, s, min(s + step, b)) / max(min(s + step, b) - s, 1e-9) for s in starts]
    return Samples(starts, np.asarray(vals, dtype=float))


def summarize_phases(
    ev: Events, phases: list[LoadPhase], gauges: dict[str, Samples], window_s: float
) -> list[PhaseSummary]:
    """Each phase's steady-state figures and the time to adapt after the change into it."""
    last_send = float(ev.send.max()) if ev.send.size else 0.0
    out = []
    for i, ph in enumerate(phases):
        start = ph.start_s or 0.0
        end = start + ph.duration_s
        frm, to, how = _steady_span(ph, end, last_send, gauges["running"], gauges["spec_steps"], window_s)
        steps, tok = gauges["spec_steps"], _tok_s_series(ev, start, end, window_s)
        changed = i > 0
        figures: dict[str, float | None] = dict.fromkeys(
            ("output_tok_s", "ttft", "tpot", "accept", "running", "steps", "power")
        )
        if frm is not None and to is not None:
            by_end, by_first = (ev.end >= frm) & (ev.end < to), (ev.first >= frm) & (ev.first < to)
            figures.update(
                output_tok_s=_tokens_in(ev, frm, to) / (to - frm),
                ttft=_median(ev.ttft[by_first]),
                tpot=_median(ev.tpot[by_end]),
                accept=_accept(ev, by_end),
                running=_mean_in(gauges["running"], frm, to),
                steps=_mean_in(steps, frm, to),
                power=_mean_in(gauges["power_w"], frm, to),
            )
        out.append(
            PhaseSummary(
                phase=i,
                label=ph.label(),
                start_s=start,
                end_s=end,
                steady_from_s=frm,
                steady_to_s=to,
                excluded=how,
                output_tok_s=figures["output_tok_s"],
                ttft_p50_s=figures["ttft"],
                tpot_p50_s=figures["tpot"],
                accept_length=figures["accept"],
                running=figures["running"],
                spec_steps=figures["steps"],
                power_w=figures["power"],
                steps_adapt_s=settle_time(steps.t, steps.v, start, end, STEPS_TOL, 0.0, carry=True)
                if changed
                else None,
                tok_s_adapt_s=settle_time(tok.t, tok.v, start, end, 0.0, SETTLE_REL) if changed else None,
            )
        )
    return out


def timeline(
    point: str, ev: Events, phases: list[LoadPhase], gauges: dict[str, Samples], window_s: float = DEFAULT_WINDOW_S
) -> Timeline:
    """The timeline of one profiled point from its events and gauges (``running``, ``spec_steps``, ``power_w``)."""
    if not window_s > 0:
        raise ValueError(f"the timeline's window must be > 0 seconds (got {window_s!r})")
    g = {k: gauges.get(k, Samples.none()) for k in ("running", "spec_steps", "power_w")}
    profile_end = max(((p.start_s or 0.0) + p.duration_s for p in phases), default=0.0)
    until = max([profile_end, *ev.end[np.isfinite(ev.end)].tolist()])
    notes = [f"no {name} samples" for name, s in g.items() if s.t.size == 0]
    return Timeline(
        point, window_s, windows(ev, phases, g, window_s, until), summarize_phases(ev, phases, g, window_s), notes
    )
