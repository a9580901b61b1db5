"""The generator's per-request bookkeeping: what building and checking one record costs (prints, never asserts).

    python benchmarks/record_path.py [--records 50000] [--repeats 5]

Times rig.loadgen.drive.PointRun._record (a record from an outcome, its width check, the writer's buffer), and
alone: a fresh record from rig.contracts.empty_record, the width check (check_record), and, as the baseline in the
same run, a record built from the schema's column names (how records were built before rig.contracts).
Best of ``--repeats`` runs of ``--records`` each.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rig.contracts import REQUEST_SCHEMA, PointColumns, check_record, empty_record  # noqa: E402
from rig.loadgen.apis import StreamState  # noqa: E402
from rig.loadgen.client import Outcome  # noqa: E402
from rig.loadgen.drive import PointRun  # noqa: E402
from rig.loadgen.plan import GeneratorPlan  # noqa: E402
from rig.workloads.base import Session, Turn  # noqa: E402


def best_us(fn, n: int, repeats: int) -> float:
    """Best time per call of ``fn(i)`` over ``repeats`` runs of ``n`` calls, in microseconds."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(n):
            fn(i)
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()

    info = PointColumns(
        run_id="bench",
        point="p0",
        engine="external",
        workload="bench",
        api="sglang-native",
        steps=0,
        server_config="c",
        server_args="{}",
        load_mode="closed",
        concurrency=1,
        rate=None,
        repeat=0,
    )
    run = PointRun(
        GeneratorPlan(point=info, generator=0, url="http://127.0.0.1:9", model="m", sessions=()),
        tempfile.mkdtemp(),
        "host",
        0.0,
    )
    run.writer.max_rows = 10**9  # nothing is written: the buffer only
    turn = Turn(request_id="r", messages=({"role": "user", "content": "hi"},), max_tokens=16)
    session = Session(session_id="s", turns=(turn,))
    state = StreamState(
        prompt_tokens=5,
        completion_tokens=16,
        finish_reason="length",
        text_parts=["a"] * 16,
        speculative={"spec_verify_ct": 4, "spec_accept_length": 2.5},
        server_ts={"server_received_ts": 1.0},
    )
    outs = [
        Outcome(
            send_mono=1.0 + i,
            end_mono=2.0 + i,
            first_mono=1.5 + i,
            chunk_offsets=[0.1] * 16,
            chunk_tokens=[1] * 16,
            state=state,
        )
        for i in range(a.records)
    ]

    def record(i: int) -> None:
        run._record(session, 0, turn, outs[i].send_mono, outs[i])

    def reset_then_record(i: int) -> None:
        if i == 0:
            run.writer._rows.clear()
        record(i)

    row = empty_record()
    full = best_us(reset_then_record, a.records, a.repeats)
    fresh = best_us(lambda i: empty_record(), a.records, a.repeats)
    check = best_us(lambda i: check_record(row), a.records, a.repeats)
    baseline = best_us(lambda i: {name: None for name in REQUEST_SCHEMA.names}, a.records, a.repeats)
    print(f"PointRun._record (whole bookkeeping of one request)   {full:6.2f} us")
    print(f"  empty_record() (a copy of a prebuilt dict)          {fresh:6.2f} us")
    print(f"  check_record() (the width check)                    {check:6.2f} us  ({100 * check / full:.1f} % of it)")
    print(
        f"baseline: a record from REQUEST_SCHEMA.names          {baseline:6.2f} us  "
        f"({baseline / fresh:.1f}x empty_record)"
    )


if __name__ == "__main__":
    main()
