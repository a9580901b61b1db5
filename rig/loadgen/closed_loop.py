"""The closed loop: slots that each send the next session as soon as their last one ended, under a profile's cap."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from itertools import chain, islice
from typing import Protocol

from rig.loadgen.open_loop import LEVEL_FAILED, Http
from rig.loadgen.phases import PhaseGate
from rig.loadgen.plan import GeneratorPlan
from rig.workloads.base import Session


class ClosedRun(Protocol):
    """What the closed loop uses of its point's run (rig.loadgen.drive.PointRun)."""

    plan: GeneratorPlan
    unreachable: bool
    ran_out_s: float | None
    cancel_reason: str
    gate: PhaseGate | None

    async def _run_session(
        self, http: Http, session: Session, intended: float, deadline: float | None, *, slot: int | None = None
    ) -> None: ...


def primed_sessions(run: ClosedRun) -> Iterator[Session]:
    """The generator's sessions with the first one per slot built already (called before the common start, so a
    duration-bound share's first sends do not wait for their sessions to be built one after another)."""
    todo = run.plan.session_iter()
    n = 1 if run.plan.slots is None else run.plan.slots
    if run.plan.phase_slots:  # slots no phase gives room never ask for a session (PhaseGate.ever)
        n = min(n, max(run.plan.phase_slots))
    return chain(list(islice(todo, n)), todo)


async def closed_loop(run: ClosedRun, http: Http, start: float, todo: Iterator[Session] | None = None) -> None:
    """Every slot of the generator until its sessions or the level's duration end."""
    todo = run.plan.session_iter() if todo is None else todo
    deadline = start + run.plan.duration_s if run.plan.duration_s else None
    # slots 0: a generator beyond the level's concurrency (C < G) sends nothing; None (a plan without a split): one
    n = 1 if run.plan.slots is None else run.plan.slots
    slots = [asyncio.ensure_future(_slot(run, http, todo, deadline, k)) for k in range(n)]
    try:
        await asyncio.gather(*slots)
    except BaseException as e:  # stopped, or one slot failed: the others' requests are cancelled and recorded
        if not isinstance(e, asyncio.CancelledError):
            run.cancel_reason = LEVEL_FAILED
        for t in slots:
            t.cancel()
        await asyncio.gather(*slots, return_exceptions=True)
        raise


async def _slot(run: ClosedRun, http: Http, todo: Iterator[Session], deadline: float | None, k: int) -> None:
    """Slot ``k``: the next session of the shared iterator as soon as the last one ended (and the phase has room)."""
    if run.gate is not None and not run.gate.ever(k):
        return  # a generator whose share is 0 in every phase: its lazy share has no session to find
    while True:
        await asyncio.sleep(0)  # building sessions is synchronous: let a stop (or the flusher) in between
        # Taken before the gate's wait, so a slot that gets room at a phase change sends at once rather than after
        # building a chunk of sessions; from the admission to the send nothing awaits (two slots never take one place).
        session = next(todo, None)
        if session is None:
            break
        if run.gate is not None and not await run.gate.admit(k, deadline):
            return  # no phase left that gives this slot room
        now = time.perf_counter()
        if (deadline is not None and now >= deadline) or run.unreachable:
            return
        await run._run_session(http, session, now, deadline, slot=k)
    now = time.perf_counter()
    if deadline is not None and now < deadline and run.ran_out_s is None and run.plan.duration_s:
        run.ran_out_s = now - (deadline - run.plan.duration_s)  # the first slot that found no session left
