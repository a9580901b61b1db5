"""The simulator's clock when its host stalls: a short stall is caught up (the modelled hardware kept working), a long
one is skipped and counted in sglang:sim_behind_seconds_total, so a report can tell that the figures understate the
model. The stalls here are time.sleep on the simulator's own event loop, which is what a busy host does to it."""

from __future__ import annotations

import asyncio
import time

from rig.sim.engine import RESYNC_S
from rig.sim.launch import build_server, prepare
from rig.sim.requests import Sampling

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


async def _generate(stall_s: float) -> tuple[float, float]:
    """Seconds one greedy request of TOKENS tokens took with the loop blocked stall_s once, a few tokens in; and the
    simulator's behind counter afterwards."""
    srv = build_server(*prepare(ARGV))
    engine = srv.engine
    try:
        t0 = time.monotonic()
        st = engine.submit(["tok"] * 40, list(range(40)), Sampling(TOKENS, 0.0, 1.0, -1, True, None), rid="r")
        while not st.finished:
            await st.event.wait()
            st.event.clear()
            if stall_s and st.n_tokens >= 20:
                time.sleep(stall_s)  # the host takes the CPU away from the simulator's loop
                stall_s = 0.0
        return time.monotonic() - t0, engine.metrics.sim_behind_seconds_total._value.get()
    finally:
        await engine.stop()


def test_a_stall_shorter_than_the_resync_window_is_caught_up_and_a_longer_one_is_counted():
    base, behind0 = asyncio.run(_generate(0.0))
    assert base > 0.5 and behind0 == 0.0  # long enough for a stall to matter; nothing skipped on an idle loop
    short = 0.5 * RESYNC_S  # half the window: room for a busy host on top of the stall
    caught, behind1 = asyncio.run(_generate(short))
    # Caught up: the late iterations ran back to back, so the request ends about when it would have, not `short` later.
    assert caught < base + short / 2, (base, caught)
    assert behind1 == 0.0
    long = 1.5 * RESYNC_S
    skipped, behind2 = asyncio.run(_generate(long))
    # Skipped: the request ends about `long` later, and the counter says how much of the model's time was lost.
    assert skipped > base + long / 2, (base, skipped)
    assert behind2 >= long * 0.9, behind2
