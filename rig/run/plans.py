"""One point as per-generator plans: its sessions and arrival offsets, their split over generators, the warm-up."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TypedDict

from rig.config import LoadSpec, RunSpec, Timeouts
from rig.contracts import PointColumns
from rig.contracts.profile import generator_share, schedule
from rig.loadgen.dialects import Dialect
from rig.loadgen.plan import GeneratorPlan, LazySessions
from rig.run.errors import RunError
from rig.run.points import Point
from rig.workloads import build_sessions, dataset_size, warmup_sessions
from rig.workloads.base import Session

LAZY_SESSION_LIMIT = 10_000_000  # global sessions a duration-bound closed-loop level may draw


class PlanCommon(TypedDict):
    """The GeneratorPlan fields every generator of one point shares."""

    point: PointColumns
    url: str
    model: str
    duration_s: float | None
    grace_s: float
    warmup: tuple[Session, ...]
    timeouts: Timeouts
    extra_headers: dict[str, str]
    dialect: Dialect


def split_closed(sessions: list[Session], concurrency: int, n_gen: int) -> list[tuple[list[Session], int]]:
    """Concurrency C over G generators sums to C; session i goes to slot i mod C, slot s to generator s mod G."""
    out: list[tuple[list[Session], int]] = []
    for g in range(n_gen):
        slots = concurrency // n_gen + (g < concurrency % n_gen)  # slots s < C with s mod G == g (no loop over C)
        mine = [sess for i, sess in enumerate(sessions) if (i % concurrency) % n_gen == g]
        if sessions:  # a fixed count: a slot beyond this generator's sessions would only wait (a million did so)
            slots = min(slots, len(mine))
        out.append((mine, slots))
    return out


def split_open(
    sessions: list[Session], offsets: list[float], n_gen: int, cap: int | None
) -> list[tuple[list[Session], list[float], int | None]]:
    """One global arrival schedule; generator g takes every G-th arrival (its slice keeps absolute offsets)."""
    out = []
    for g in range(n_gen):
        idx = list(range(g, len(sessions), n_gen))
        slot_cap = None if cap is None else max(1, sum(1 for s in range(cap) if s % n_gen == g))
        out.append(([sessions[i] for i in idx], [offsets[i] for i in idx], slot_cap))
    return out


def shorten(session: Session) -> Session:
    """Warm-up sessions: first turn only, at most 32 output tokens."""
    turn = replace(session.turns[0], max_tokens=min(32, session.turns[0].max_tokens), think_time_s=0.0)
    return replace(session, turns=(turn,))


def point_sessions(load: LoadSpec, p: Point) -> tuple[list[Session], list[float] | None]:
    """The point's sessions and, for open-loop modes, their arrival offsets (none when generators draw lazily)."""
    n = load.requests_for(p.concurrency, p.rate)
    if load.mode == "closed":
        if n is None:  # duration-bound: each generator builds its share lazily (see build_plans)
            return [], None
        return build_sessions(p.workload, seed=load.seed, n_sessions=n), None
    from rig.loadgen import arrivals

    if load.mode == "trace":
        if p.workload.name != "dataset":
            raise RunError("trace replay needs the dataset workload (a file whose records carry 'timestamp')")
        sessions = build_sessions(p.workload, seed=load.seed, n_sessions=n or dataset_size(p.workload) or 0)
        stamps = [s.arrival_s for s in sessions if s.arrival_s is not None]
        if len(stamps) != len(sessions):
            raise RunError("trace replay needs a dataset whose records carry 'timestamp'")
        offsets = list(arrivals.trace_offsets(stamps, speed=load.trace_speed))
        return sessions, offsets
    if load.profile:
        phases = [
            (ph.rate or 0.0, ph.rate_end if ph.rate_end is not None else ph.rate or 0.0, ph.duration_s)
            for ph in load.profile
        ]
        offs = arrivals.profile_offsets(load.mode, phases, seed=load.seed, cv=load.burstiness).tolist()
        return build_sessions(p.workload, seed=load.seed, n_sessions=len(offs)), offs
    if n is None:
        n = max(1, int((p.rate or 1) * (load.duration_s or 60) * 1.5) + 16)
    if p.rate is None:  # LoadSpec requires rates for the open-loop modes
        raise RunError(f"mode {load.mode} needs a rate (--rate)")
    offsets = list(arrivals.arrival_offsets(load.mode, rate=p.rate, n=n, seed=load.seed, burstiness=load.burstiness))
    if load.duration_s:
        offsets = [o for o in offsets if o < load.duration_s]
    # a dataset without cycle has at most its entries: the arrivals past them are not sent (supply_end says when)
    return build_sessions(p.workload, seed=load.seed, n_sessions=len(offsets)), offsets


def supply_end(load: LoadSpec, sessions: list[Session], offsets: list[float] | None) -> float | None:
    """A level bound by its duration whose schedule has more arrivals than the workload has sessions: the due offset
    of the first arrival left without one (the level ends early there; its point is flagged dataset_exhausted)."""
    if load.duration_s is None or offsets is None or len(sessions) >= len(offsets):
        return None
    return offsets[len(sessions)]


def build_plans(
    spec: RunSpec,
    p: Point,
    url: str,
    model: str,
    api: str,
    ids: list[int],
    api_key: str | None,
    dialect: Dialect | None = None,
) -> list[GeneratorPlan]:
    """One plan per generator (``ids``, in order) for point ``p`` against the server at ``url``, whose requests
    speak ``dialect`` (default: the SGLang dialect)."""
    load = spec.load
    info = PointColumns(
        **p.identity(load.mode).model_dump(),
        run_id=spec.run_id,
        api=api,
        server_args=json.dumps(p.server.knobs(), sort_keys=True),
    )
    sessions, offsets = point_sessions(load, p)
    n_gen = len(ids)
    # Warm-up content differs from the measured requests (it must not pre-fill the prefix cache for them).
    warm = [shorten(s) for s in warmup_sessions(p.workload, seed=load.seed, n_sessions=load.warmup_requests)]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    common = PlanCommon(
        point=info,
        url=url,
        model=model,
        duration_s=load.duration_s,
        grace_s=load.grace_s,
        warmup=tuple(warm),
        timeouts=load.timeouts,
        extra_headers=headers,
        dialect=dialect if dialect is not None else Dialect(),
    )
    conc = p.concurrency or 1
    if offsets is None and load.requests_for(p.concurrency, p.rate) is None:
        # Bound by duration: no session list crosses Ray; generators build theirs as they go.
        plans = [
            GeneratorPlan(
                generator=ids[i],
                sessions=(),
                slots=slots,
                lazy=LazySessions(p.workload, load.seed, conc, n_gen, i, limit=LAZY_SESSION_LIMIT),
                **common,
            )
            for i, (_, slots) in enumerate(split_closed([], conc, n_gen))
        ]
    elif offsets is None:
        plans = [
            GeneratorPlan(generator=ids[i], sessions=tuple(mine), slots=slots, **common)
            for i, (mine, slots) in enumerate(split_closed(sessions, p.concurrency or 1, n_gen))
        ]
    else:
        ends = supply_end(load, sessions, offsets)
        plans = [
            GeneratorPlan(
                generator=ids[i], sessions=tuple(mine), arrivals=tuple(offs), slots=cap, supply_ends_s=ends, **common
            )
            for i, (mine, offs, cap) in enumerate(split_open(sessions, offsets, n_gen, p.concurrency))
        ]
    plans = [replace(plan, warmup=own_warmup(plan.warmup, plan.generator)) for plan in plans]
    return with_phases(plans, load) if load.profile else plans


def with_phases(plans: list[GeneratorPlan], load: LoadSpec) -> list[GeneratorPlan]:
    """A load profile on each generator: the phases' starts and, closed loop, its share of each phase's
    concurrency (as split_closed shares a fixed level: the shares sum to the phase's concurrency)."""
    assert load.profile is not None
    starts = tuple(ph.start_s or 0.0 for ph in schedule(load.profile))
    n_gen = len(plans)
    out = []
    for i, plan in enumerate(plans):
        if load.mode != "closed":
            out.append(replace(plan, phase_starts=starts))
            continue
        caps = tuple(generator_share(ph.concurrency or 0, n_gen, i) for ph in load.profile)
        out.append(replace(plan, phase_starts=starts, phase_slots=caps, slots=max(1, *caps)))
    return out


def own_warmup(warm: tuple[Session, ...], generator: int) -> tuple[Session, ...]:
    """Each generator's warm-up under request ids of its own: the generators warm up at once, and SGLang refuses a
    rid that is still in flight ("Duplicate request ID detected", managers/tokenizer_manager.py)."""
    return tuple(
        replace(s, turns=tuple(replace(t, request_id=f"{t.request_id}-g{generator}") for t in s.turns)) for s in warm
    )
