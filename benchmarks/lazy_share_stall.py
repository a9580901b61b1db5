"""How long a duration-bound closed-loop share stalls its generator's event loop per session (prints only).

    .venv/bin/python benchmarks/lazy_share_stall.py [--sessions 300] [--workloads greedy,realistic,agentic]

A closed-loop level bound by its duration builds its sessions on the generator as it goes
(rig.loadgen.plan.LazySessions): each ``next()`` runs synchronously on the loop that also reads every stream, so
its time is loop lag, and loop lag is read-time error on every token in flight. For generator 0 of N (concurrency
16 x N, as in benchmarks/scale_out.py), this times each ``next()`` over ``--sessions`` of its own sessions, for the
product's share and, as the baseline in the same run, the share as it was built before (chunks of 256 *global*
sessions, the other generators' included, filtered to this one's; both with today's session builders). Figures:
stall p50 / p99 / max per ``next()`` and CPU per own session drawn. The scale-out benchmark on the device's 16
cores measures the effect on ITL error.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rig.loadgen.plan import LazySessions  # noqa: E402
from rig.workloads import WorkloadSpec, build_session_range  # noqa: E402
from rig.workloads.base import Session  # noqa: E402

OLD_CHUNK = 256


def before_share(spec: WorkloadSpec, seed: int, conc: int, n_gen: int, index: int, limit: int) -> Iterator[Session]:
    """The share as built until ef3ba31: every global session, 256 at a time, this generator's kept (the baseline)."""
    for start in range(0, limit, OLD_CHUNK):
        for offset, session in enumerate(build_session_range(spec, seed=seed, start=start, stop=start + OLD_CHUNK)):
            if ((start + offset) % conc) % n_gen == index:
                yield session


def stalls(share: Iterator[Session], n: int) -> np.ndarray:
    """Seconds each of n ``next()`` calls took."""
    out = np.empty(n)
    for k in range(n):
        t = time.perf_counter()
        next(share)
        out[k] = time.perf_counter() - t
    return out


def row(label: str, s: np.ndarray) -> str:
    ms = s * 1e3
    return (
        f"{label:8} stall p50 {np.percentile(ms, 50):7.3f} ms  p99 {np.percentile(ms, 99):8.3f} ms  "
        f"max {ms.max():8.3f} ms  CPU {ms.mean():6.3f} ms a session"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=300, help="own sessions drawn per share")
    ap.add_argument("--workloads", default="greedy,realistic,agentic")
    ap.add_argument("--n", default="1,8", help="generator counts")
    args = ap.parse_args()
    limit = 10_000_000
    for name in args.workloads.split(","):
        spec = WorkloadSpec(name=name)
        build_session_range(spec, seed=0, start=0, stop=2)  # imports, corpus and source-tree caches warm
        n_sessions = args.sessions if name != "agentic" else max(20, args.sessions // 10)
        for n_gen in (int(x) for x in args.n.split(",")):
            conc = 16 * n_gen
            new = stalls(iter(LazySessions(spec, 0, conc, n_gen, 0, limit=limit)), n_sessions)
            old = stalls(before_share(spec, 0, conc, n_gen, 0, limit), n_sessions)
            print(f"{name}, N={n_gen} (C={conc}), {n_sessions} sessions of generator 0:")
            print("  " + row("before", old))
            print("  " + row("now", new))
            p99 = np.percentile(old, 99) / np.percentile(new, 99)
            print(
                f"  max stall {old.max() / new.max():.1f}x shorter, p99 {p99:.1f}x,"
                f" CPU a session {old.mean() / new.mean():.1f}x less (the baseline's CPU includes sessions it built"
                " and did not draw)"
            )


if __name__ == "__main__":
    main()
