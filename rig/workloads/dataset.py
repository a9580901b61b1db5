"""Sessions from a user dataset file (one turn each), with sampling parameters from the spec.

Session i uses entry i of the file (N usable entries), through a seeded permutation if ``shuffle``. Asking for more
than N sessions returns N (a file is a finite set of requests; a trace replay asks for "all"), unless ``cycle`` is
set: then session i uses entry ``i mod N`` and the file repeats with new request ids. With timestamps (and
``use_timestamps``, not ``shuffle``), ``Session.arrival_s`` is the entry's timestamp minus the first one's; each later
cycle is shifted by the trace's span plus one mean gap, so a repeated trace keeps its shape. Warm-up sessions take
entries from the end of the file backwards, so they overlap measured prompts only in small files.
max_tokens: the spec's ``max_tokens`` if set, else the entry's (or its ShareGPT reply-length hint), else
``fallback_max_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from rig.workloads.base import Session, Turn
from rig.workloads.datafile import Entry, read_dataset
from rig.workloads.seeding import WARMUP, request_seed, session_rng
from rig.workloads.spec import WorkloadSpec


def entries_for(spec: WorkloadSpec) -> tuple[Entry, ...]:
    """The spec's file, parsed (a WorkloadError names the file, the line or entry, and the problem)."""
    assert spec.path is not None  # the spec validator guarantees it
    return read_dataset(
        spec.path, spec.format, use_reply_length=spec.use_reply_length, chars_per_token=spec.text_chars_per_token
    )


@lru_cache(maxsize=8)
def _order(shuffle: bool, seed: int, n: int, stream: int) -> np.ndarray:
    """Entry order: file order, a seeded permutation (shuffle), reversed for warm-up (cached: a generator's lazy
    share builds a session at a time, and a permutation per session would cost O(entries) each)."""
    order = np.arange(n)
    if shuffle:
        # Depends on the seed and N only, never on how many sessions are asked for: prefix-stable.
        order = np.random.default_rng(np.random.SeedSequence([seed, n, 0x5EED])).permutation(n)
    return order[::-1] if stream == WARMUP else order


def build(spec: WorkloadSpec, seed: int, indices: Sequence[int], id_prefix: str, stream: int) -> list[Session]:
    """Sessions ``indices`` of the dataset workload."""
    entries = entries_for(spec)
    n = len(entries)
    order = _order(spec.shuffle, seed, n, stream)
    timed = spec.use_timestamps and not spec.shuffle and entries[0].timestamp is not None
    if timed:
        t0, t_last = entries[0].timestamp or 0.0, entries[-1].timestamp or 0.0
        span = t_last - t0
        period = span + (span / (n - 1) if n > 1 else 0.0)
    out = []
    for i in indices:
        if i >= n and not spec.cycle:
            break
        rng = session_rng(seed, spec.name, i, stream)
        entry = entries[int(order[i % n])]
        sid = f"{id_prefix}-{i:06d}"
        turn = Turn(
            request_id=f"{sid}-t0",
            messages=entry.messages,
            max_tokens=spec.max_tokens or entry.max_tokens or spec.fallback_max_tokens,
            **spec.sampling(),
            seed=request_seed(rng),
            category="dataset",
        )
        arrival = None
        if timed and stream != WARMUP:
            arrival = (entry.timestamp or 0.0) - t0 + (i // n) * period
        out.append(Session(session_id=sid, turns=(turn,), arrival_s=arrival, extra={"source": entry.where}))
    return out


def size(spec: WorkloadSpec) -> int:
    """Usable entries in the spec's file (the natural session count for a trace replay)."""
    return len(entries_for(spec))


EPOCH_MS = 1e11  # a timestamp above this is no second count (year 5138) but milliseconds since the epoch (1.7e12 now)
LONG_REPLAY_S = 3600.0  # a replay longer than this is said before it starts
IDLE_GAP_S = 60.0  # a gap longer than this, and ...
IDLE_GAP_RATIO = 100.0  # ... this many times the median gap, leaves the server idle for it


def trace_notes(spec: WorkloadSpec, speed: float) -> list[str]:
    """What a trace replay of the spec's file will do that its timestamps may not mean: a replay of hours (timestamps
    in milliseconds read as seconds), a gap that leaves the server idle. Said before the run starts."""
    entries = entries_for(spec)
    stamps = np.array([e.timestamp for e in entries if e.timestamp is not None], dtype=np.float64)
    if stamps.size < 2 or not spec.use_timestamps or spec.shuffle:
        return []
    out = []
    span = float(stamps[-1] - stamps[0]) / speed
    gaps = np.diff(stamps) / speed
    if stamps[0] > EPOCH_MS:
        out.append(
            f"{spec.path}: timestamps are read as seconds, and {stamps[0]:,.0f} looks like milliseconds since the "
            f"epoch: the replay would span {_duration(span)} (divide the timestamps by 1000)"
        )
    elif span > LONG_REPLAY_S:
        unit = " (timestamps are read as seconds: milliseconds would replay 1000x too slowly)"
        out.append(f"{spec.path}: the replay spans {_duration(span)} at --trace-speed {speed:g}{unit}")
    i = int(np.argmax(gaps))
    median = float(np.median(gaps))
    if gaps[i] > IDLE_GAP_S and gaps[i] > IDLE_GAP_RATIO * median:
        out.append(
            f"{entries[i + 1].where}: {gaps[i]:,.0f} s after the entry before it (the median gap is {median:.3g} s): "
            f"the replay leaves the server idle that long"
        )
    return out


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400.0), ("hours", 3600.0), ("minutes", 60.0)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:.0f} s"
