"""One rig generator process without Ray: the real PointRun (client, records, part files) on uvloop.

    python benchmarks/rig_generator.py --url http://127.0.0.1:P --out DIR --mode closed --concurrency 64 \
        --requests 640 --max-tokens 256 [--index 0 --of 1] [--start-in 0.5]

This is exactly the code a LoadGenerator actor runs per point (rig.loadgen.drive.PointRun), started as a plain
process so a benchmark can pin it with taskset and count its CPU. ``--index/--of`` take one share of the load
(closed loop: the slots and sessions; open loop: every k-th arrival), as ``per_host`` generators do. Prints one
JSON line: the generator's summary plus its CPU seconds over the level.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rig.contracts import PointColumns  # noqa: E402
from rig.loadgen.drive import PointRun, make_session  # noqa: E402
from rig.loadgen.plan import GeneratorPlan  # noqa: E402
from rig.workloads.base import Session, Turn  # noqa: E402


def plan_for(a: argparse.Namespace) -> GeneratorPlan:
    info = PointColumns(
        run_id="bench",
        point="p0",
        engine="external",
        workload="bench",
        api="openai-completions",
        steps=0,
        server_config="truth",
        server_args="{}",
        load_mode=a.mode,
        concurrency=a.concurrency if a.mode == "closed" else None,
        rate=a.rate if a.mode == "poisson" else None,
        repeat=0,
    )
    prompt = "Write one token after another until told to stop. " * 2

    def session(i: int) -> Session:
        t = Turn(
            request_id=f"g{a.index}-r{i}",
            messages=({"role": "user", "content": prompt},),
            max_tokens=a.max_tokens,
            ignore_eos=True,
        )
        return Session(session_id=f"g{a.index}-s{i}", turns=(t,))

    if a.mode == "closed":
        mine = [i for i in range(a.requests) if (i % a.concurrency) % a.of == a.index]
        slots = len([s for s in range(a.concurrency) if s % a.of == a.index])
        return GeneratorPlan(
            point=info,
            generator=a.index,
            url=a.url,
            model="truth",
            sessions=tuple(session(i) for i in mine),
            slots=slots,
        )
    rng = np.random.default_rng(a.seed)
    offsets = np.cumsum(rng.exponential(1.0 / a.rate, a.requests))
    mine = list(range(a.index, a.requests, a.of))
    return GeneratorPlan(
        point=info,
        generator=a.index,
        url=a.url,
        model="truth",
        sessions=tuple(session(i) for i in mine),
        arrivals=tuple(float(offsets[i]) for i in mine),
    )


async def main_async(a: argparse.Namespace) -> dict:
    plan = plan_for(a)
    run = PointRun(plan, a.out, "bench", clock_offset_s=0.0)
    start = a.start_at if a.start_at else time.perf_counter() + a.start_in
    async with make_session(a.client) as http:
        t0 = os.times()
        report = await run.run(http, start)
        t1 = os.times()
    summary = report.model_dump()
    summary["cpu_s"] = (t1[0] - t0[0]) + (t1[1] - t0[1])
    summary["cpu_user_s"], summary["cpu_sys_s"] = t1[0] - t0[0], t1[1] - t0[1]
    summary["started_mono"] = run.started_mono
    summary["ended_mono"] = run.ended_mono
    summary["unstamped_reads"] = getattr(http, "unstamped", None)  # lean client: reads without a kernel stamp
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--mode", choices=["closed", "poisson"], default="closed")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--requests", type=int, default=640)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--of", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start-in", type=float, default=0.5, help="seconds from now to the level start")
    ap.add_argument("--start-at", type=float, default=None, help="level start as a perf_counter value (shared)")
    ap.add_argument("--client", choices=["lean", "aiohttp"], default="lean")
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    a = ap.parse_args()
    if a.loop == "uvloop":
        import uvloop

        summary = uvloop.run(main_async(a))
    else:
        import asyncio

        summary = asyncio.run(main_async(a))
    print(json.dumps(summary, default=str), flush=True)


if __name__ == "__main__":
    main()
