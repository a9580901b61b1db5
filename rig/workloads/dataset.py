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


def _order(spec: WorkloadSpec, seed: int, n: int, stream: int) -> np.ndarray:
    """Entry order: file order, a seeded permutation (shuffle), reversed for warm-up."""
    order = np.arange(n)
    if spec.shuffle:
        # Depends on the seed and N only, never on how many sessions are asked for: prefix-stable.
        order = np.random.default_rng(np.random.SeedSequence([seed, n, 0x5EED])).permutation(n)
    return order[::-1] if stream == WARMUP else order


def build(spec: WorkloadSpec, seed: int, indices: range, id_prefix: str, stream: int) -> list[Session]:
    """Sessions ``indices`` of the dataset workload."""
    entries = entries_for(spec)
    n = len(entries)
    order = _order(spec, seed, n, stream)
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
