"""Workloads: a spec and a seed in, a deterministic, prefix-stable list of sessions out.

``build_sessions(spec, seed=s, n_sessions=n)`` returns sessions ``0..n-1``; session i depends only on (spec, s, i),
so the first n of a longer list equal the shorter list and every sweep point sees the same requests (ids, prompts,
sampling parameters, per-request seeds, arrival offsets). Ids: session ``"{workload}-{i:06d}"``, turn
``"{session_id}-t{j}"``; warm-up sessions use ``"{workload}-warmup-{i:06d}"`` and an independent seed stream.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from rig.workloads.base import Session, Turn, render_messages
from rig.workloads.errors import WorkloadError
from rig.workloads.spec import Dist, WorkloadSpec

__all__ = [
    "Dist",
    "Session",
    "Turn",
    "WorkloadError",
    "WorkloadSpec",
    "build_session_indices",
    "build_session_range",
    "build_sessions",
    "dataset_size",
    "render_messages",
    "sessions_digest",
    "warmup_sessions",
]

_MAX_SESSIONS = 10_000_000  # a guard against a typo'd count eating the driver's memory


def _check(spec: WorkloadSpec, seed: int, n: int) -> None:
    if not isinstance(spec, WorkloadSpec):
        raise WorkloadError(f"workload: expected a WorkloadSpec, got {type(spec).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise WorkloadError(f"workload seed must be an integer >= 0 (got {seed!r})")
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= _MAX_SESSIONS:
        raise WorkloadError(f"workload n_sessions must be an integer in [0, {_MAX_SESSIONS}] (got {n!r})")


def _build(spec: WorkloadSpec, seed: int, indices: Sequence[int], name: str, *, warmup: bool = False) -> list[Session]:
    # The builders (and numpy, which they draw with) load on first use: rig.config and the CLI import this package
    # for WorkloadSpec alone, and `rig --version` must not pay numpy's ~0.1 s of start-up.
    from rig.workloads import agentic, dataset, greedy, realistic
    from rig.workloads.seeding import MAIN, WARMUP

    builders = {
        "greedy": greedy.build,
        "realistic": realistic.build,
        "agentic": agentic.build,
        "dataset": dataset.build,
    }
    return builders[spec.name](spec, seed, indices, name, WARMUP if warmup else MAIN)


def build_sessions(spec: WorkloadSpec, *, seed: int, n_sessions: int) -> list[Session]:
    """Sessions 0..n_sessions-1 of ``spec`` under ``seed``: deterministic and prefix-stable.

    A dataset workload without ``cycle`` returns at most as many sessions as its file has usable entries.
    """
    _check(spec, seed, n_sessions)
    return _build(spec, seed, range(n_sessions), spec.name)


def build_session_range(spec: WorkloadSpec, *, seed: int, start: int, stop: int) -> list[Session]:
    """Sessions start..stop-1: the same sessions ``build_sessions`` would return at those indices (lazy building)."""
    _check(spec, seed, stop)
    if not 0 <= start <= stop:
        raise WorkloadError(f"workload session range must satisfy 0 <= start <= stop (got {start}, {stop})")
    return _build(spec, seed, range(start, stop), spec.name)


def build_session_indices(spec: WorkloadSpec, *, seed: int, indices: Sequence[int]) -> list[Session]:
    """Sessions at the given increasing indices: each the session ``build_sessions`` would return there (a
    generator's own share, built without the other generators' sessions)."""
    last = indices[-1] + 1 if indices else 0
    _check(spec, seed, last)
    if any(b <= a for a, b in zip(indices, indices[1:], strict=False)) or (indices and indices[0] < 0):
        raise WorkloadError("workload session indices must be increasing and >= 0")
    return _build(spec, seed, indices, spec.name)


def warmup_sessions(spec: WorkloadSpec, *, seed: int, n_sessions: int) -> list[Session]:
    """Warm-up sessions: same shape as the workload's, different content and ids (never equal to measured ones)."""
    _check(spec, seed, n_sessions)
    return _build(spec, seed, range(n_sessions), f"{spec.name}-warmup", warmup=True)


def uses_source_tree(spec: WorkloadSpec) -> bool:
    """Whether the workload's prompts quote a source tree (code_dir, default this Python's standard library)."""
    return spec.name == "agentic" or (spec.name == "realistic" and spec.code_fraction > 0)


def corpus_fingerprints(specs: list[WorkloadSpec]) -> dict[str, dict[str, object]]:
    """Per workload that quotes source code, the fingerprint of the tree this host would quote."""
    from rig.workloads.source import tree_fingerprint

    return {s.name: tree_fingerprint(s.code_dir) for s in specs if uses_source_tree(s)}


def dataset_size(spec: WorkloadSpec) -> int | None:
    """Usable entries in a dataset workload's file (a trace replay's natural count); None for other workloads."""
    if spec.name != "dataset":
        return None
    from rig.workloads import dataset

    return dataset.size(spec)


def sessions_digest(sessions: list[Session]) -> str:
    """A sha256 over everything sent (ids, messages, sampling, seeds, think times, arrivals): equal digests on two
    sweep points or generators prove they were given the same requests."""
    h = hashlib.sha256()
    for s in sessions:
        h.update(json.dumps([s.session_id, s.arrival_s], sort_keys=True).encode())
        for t in s.turns:
            h.update(
                json.dumps(
                    [
                        t.request_id,
                        t.messages,
                        t.max_tokens,
                        t.temperature,
                        t.top_p,
                        t.top_k,
                        t.ignore_eos,
                        t.seed,
                        t.think_time_s,
                        t.category,
                    ],
                    sort_keys=True,
                ).encode()
            )
    return h.hexdigest()
