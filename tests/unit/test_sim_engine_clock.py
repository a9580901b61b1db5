"""The simulator's clock when its host stalls: a short stall is caught up (the modelled hardware kept working) and its
late iterations are counted in sglang:sim_late_iterations_total; a long one is skipped and counted in
sglang:sim_behind_seconds_total, so a report can tell that the figures understate or mistime the model. A request
that arrives while the clock catches up joins no iteration that began before it came. The stalls here are time.sleep
on the simulator's own event loop, which is what a busy host does to it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from rig.sim.engine import RESYNC_S, Engine
from rig.sim.launch import build_server, prepare
from rig.sim.requests import Sampling, build_req, plan_request, prompt_key
from rig.sim.scheduler import Req
from rig.sim.text import stable_hash

TOKENS = 300
ARGV = [
    "--model-path",
    "sim-model",
    "--tp-size",
    "4",
    "--speculative-algorithm",
    "EAGLE",
    "--speculative-num-steps",
    "4",
    "--speculative-num-draft-tokens",
    "5",
    "--speculative-eagle-topk",
    "1",
]


@dataclass
class Outcome:
    seconds: float  # the request's wall time
    behind_s: float  # sglang:sim_behind_seconds_total afterwards
    late: float  # sglang:sim_late_iterations_total afterwards
    wakes_while_late: int  # times the stream was woken by an iteration that ended over 50 ms late


async def _generate(stall_s: float) -> Outcome:
    """One greedy request of TOKENS tokens with the loop blocked stall_s once, a few tokens in."""
    srv = build_server(*prepare(ARGV))
    engine = srv.engine
    m = engine.metrics
    try:
        t0 = time.monotonic()
        st = engine.submit(["tok"] * 40, list(range(40)), Sampling(TOKENS, 0.0, 1.0, -1, True, None), rid="r")
        wakes_while_late = 0
        while not st.finished:
            await st.event.wait()
            st.event.clear()
            wakes_while_late += m.sim_lag._value.get() > 0.05
            if stall_s and st.n_tokens >= 20:
                time.sleep(stall_s)  # the host takes the CPU away from the simulator's loop
                stall_s = 0.0
        return Outcome(
            time.monotonic() - t0,
            m.sim_behind_seconds_total._value.get(),
            m.sim_late_iterations_total._value.get(),
            wakes_while_late,
        )
    finally:
        await engine.stop()


def test_a_stall_shorter_than_the_resync_window_is_caught_up_and_a_longer_one_is_counted():
    base = asyncio.run(_generate(0.0))
    # Long enough for a stall to matter; nothing skipped or late on an idle loop.
    # (not base.late == 0: on a busy host an iteration may end 0.1 s late with no stall of ours)
    assert base.seconds > 0.5 and base.behind_s == 0.0, base
    short = 0.5 * RESYNC_S  # half the window: room for a busy host on top of the stall
    caught = asyncio.run(_generate(short))
    # Caught up: the late iterations ran back to back, so the request ends about when it would have, not `short` later.
    assert caught.seconds < base.seconds + short / 2, (base, caught)
    assert caught.behind_s == 0.0
    # But not hidden: the iterations that ended late are counted, and the stream got each one's tokens as it ended
    # (the catch-up yields), not all of them in one burst at its end.
    assert caught.late >= 5 and caught.wakes_while_late >= 5, caught
    long = 1.5 * RESYNC_S
    skipped = asyncio.run(_generate(long))
    # Skipped: the request ends about `long` later, and the counter says how much of the model's time was lost.
    assert skipped.seconds > base.seconds + long / 2, (base, skipped)
    assert skipped.behind_s >= long * 0.9, skipped


def test_a_request_that_arrives_while_the_clock_catches_up_joins_no_earlier_iteration():
    asyncio.run(_arrival_while_behind())


async def _arrival_while_behind() -> None:
    srv = build_server(*prepare(ARGV))
    engine = srv.engine
    sched = engine.sched  # driven by hand here: the engine's own loop sleeps, as nothing woke it
    try:
        first = _req(engine, "a")
        sched.submit(first, 10.0)
        it = sched.plan(10.0)
        assert it is not None and it.reqs == [first]
        t = 10.0 + it.duration
        sched.complete(it, t, 10.0)
        late = _req(engine, "b")
        sched.submit(late, t + 1.0)  # arrived by the wall clock a second after the schedule's current time
        nxt = sched.plan(t)
        assert nxt is not None and late not in nxt.reqs and late in sched.waiting  # the first decodes alone
        sched.complete(nxt, t + nxt.duration, t)
        after = sched.plan(t + 1.0)  # the schedule has reached its arrival
        assert after is not None and late in after.reqs
    finally:
        await engine.stop()


def _req(engine: Engine, rid: str) -> Req:
    s = Sampling(TOKENS, 0.0, 1.0, -1, True, None)
    plan = plan_request(engine.profile, 4, ["tok"] * 40, prompt_key(list(range(40))), s)
    return build_req(rid, plan, 40, s, stable_hash("acc", 0, rid))
