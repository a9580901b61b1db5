"""Where an open loop's schedule slip goes: one traced rig generator level against the truth server (prints only).

    .venv/bin/python benchmarks/slip_sources.py [--rate 2000] [--level-s 4] [--repeats 1] [--tree DIR] [--no-trace]

Starts the truth server (unpaced, one token per write) pinned to CPU 1 and runs one open-loop Poisson level of
16-token requests in a child process pinned to CPU 0: the real PointRun (lean client, records, Parquet parts) on a
uvloop loop whose callbacks are timed. Every callback the loop runs (reads, the pacer's timer, task steps, timer
handles) is logged with its wall time and the loop thread's CPU time over it; so are garbage collections (gc
callbacks) and the part writer's writes (its thread's CPU). For every send later than --late-ms it then says where
the time between the due time and the send went:

  running  the part of a callback that was already running at the due time (by what it was)
  queued   callbacks that ran after the due time and before the timer's own callback (by what they were)
  sender   the timer's callback before this send (the sends due just before it, in a burst)
  idle     time in no callback: the loop waking from epoll, the process waiting for its core, or the GIL

and how much of the "running" and "queued" wall time the loop thread spent off its CPU (runnable but waiting for
its core, or waiting for the GIL the part writer's thread held), with whether a part write or a gc overlapped.
Timing adds ~1-2 us per callback, so slip here is a little higher than untraced; --no-trace runs the same level
untraced. --tree runs another checkout's rig (e.g. a `git archive` of main) with the same harness.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FAR_BEHIND_S = 0.050  # sends later than this are counted, not attributed


def _label(cb: Any) -> str:
    """A short name for a loop callback: a task step by its coroutine, a bound method by its qualified name."""
    owner = getattr(cb, "__self__", None)
    if isinstance(owner, asyncio.Task):  # a task step or wake-up (C task: a method wrapper whose __self__ is it)
        coro = owner.get_coro()
        return "task " + getattr(coro, "__qualname__", type(coro).__name__)
    func = getattr(cb, "__func__", cb)
    return getattr(func, "__qualname__", None) or type(cb).__name__


class Trace:
    """Wall start, wall duration, loop-thread CPU duration (ns) and label of every callback the loop ran."""

    def __init__(self) -> None:
        # flat arrays, not tuples: a tracer that made a tracked object per callback would feed the GC it measures
        self.t0, self.dur, self.cpu, self.kind = array("q"), array("q"), array("q"), array("i")
        self.names: list[str] = []
        self._ids: dict[str, int] = {}
        self.gcs: list[tuple[int, int, int, bool]] = []  # (start, duration, generation, on the loop's thread)
        self.writes: list[tuple[int, int, int]] = []  # part writer: (start, duration, its thread's CPU)
        self._gc_start = 0
        self._main = threading.get_ident()

    def wrap(self, cb: Callable, label: str | None = None) -> Callable:
        name = label or _label(cb)
        kind = self._ids.get(name)
        if kind is None:
            kind = self._ids[name] = len(self.names)
            self.names.append(name)
        starts, durs, cpus, kinds = self.t0.append, self.dur.append, self.cpu.append, self.kind.append
        clock, cpu = time.perf_counter_ns, time.thread_time_ns

        def timed(*args: Any) -> Any:
            t0, c0 = clock(), cpu()
            try:
                return cb(*args)
            finally:
                t1, c1 = clock(), cpu()
                starts(t0)
                durs(t1 - t0)
                cpus(c1 - c0)
                kinds(kind)

        return timed

    def calls(self) -> list[tuple[int, int, int, str]]:
        names = self.names
        return sorted(zip(self.t0, self.dur, self.cpu, (names[k] for k in self.kind), strict=False))

    def on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter_ns()
        else:
            self.gcs.append(
                (
                    self._gc_start,
                    time.perf_counter_ns() - self._gc_start,
                    info["generation"],
                    threading.get_ident() == self._main,
                )
            )


def tracing_loop(trace: Trace) -> asyncio.AbstractEventLoop:
    """A uvloop loop whose callbacks (call_soon, timers, readers, writers) are timed into ``trace``."""
    import uvloop

    class TracingLoop(uvloop.Loop):  # type: ignore[misc]
        def call_soon(self, cb, *args, context=None):  # type: ignore[no-untyped-def]
            return super().call_soon(trace.wrap(cb), *args, context=context)

        def call_later(self, delay, cb, *args, context=None):  # type: ignore[no-untyped-def]
            return super().call_later(delay, trace.wrap(cb), *args, context=context)

        def call_at(self, when, cb, *args, context=None):  # type: ignore[no-untyped-def]
            return super().call_at(when, trace.wrap(cb), *args, context=context)

        def add_reader(self, fd, cb, *args):  # type: ignore[no-untyped-def]
            return super().add_reader(fd, trace.wrap(cb), *args)

        def add_writer(self, fd, cb, *args):  # type: ignore[no-untyped-def]
            return super().add_writer(fd, trace.wrap(cb), *args)

    return TracingLoop()


def _overlap(a0: int, a1: int, b0: int, b1: int) -> int:
    return max(0, min(a1, b1) - max(a0, b0))


def attribute_calls(
    calls: list[tuple[int, int, int, str]],
    trace_gcs: list,
    trace_writes: list,
    sends: list[tuple[float, float]],
    late_s: float,
) -> dict[str, Any]:
    """Split the slip of every late send into gc / running / queued / sender / idle (see the module docstring)."""
    import bisect

    starts = [c[0] for c in calls]
    ends_max: list[int] = []  # running max of callback ends: where to start looking back from
    m = 0
    for t0, dur, _, _ in calls:
        m = max(m, t0 + dur)
        ends_max.append(m)
    gcs = sorted((g0, g0 + gd, main) for g0, gd, _, main in trace_gcs)
    parts: dict[str, float] = defaultdict(float)
    by_label: dict[str, dict[str, float]] = {k: defaultdict(float) for k in ("running", "queued", "sender")}
    offcpu: dict[str, float] = defaultdict(float)
    overlaps = {"part write": 0, "gc (loop thread)": 0, "gc (other thread)": 0}
    idle_in_write = 0.0
    late = [(d, s) for d, s in sends if late_s < s - d <= FAR_BEHIND_S]
    far = sum(1 for d, s in sends if s - d > FAR_BEHIND_S)  # behind schedule: not attributed (it would take ages)
    max_cb: dict[str, int] = defaultdict(int)  # the longest callback of each kind over the level (ns)
    for _, dur, _, name in calls:
        max_cb[name] = max(max_cb[name], dur)
    for due_s, send_s in late:
        due, send = int(due_s * 1e9), int(send_s * 1e9)
        # the callback that made the send: the last one started at or before it
        j = bisect.bisect_right(starts, send) - 1
        sender_start = max(due, calls[j][0]) if j >= 0 else due
        if j >= 0:
            part = send - sender_start
            parts["sender"] += part
            by_label["sender"][calls[j][3]] += part
        # gc on the loop thread inside [due, sender_start) is counted as gc, not as the callback it interrupted
        gc_ns = 0
        for g0, g1, main in gcs:
            ov = _overlap(g0, g1, due, send)
            if ov:
                overlaps["gc (loop thread)" if main else "gc (other thread)"] += 1
                if main:
                    gc_ns += _overlap(g0, g1, due, sender_start)
        parts["gc"] += gc_ns
        covered = gc_ns
        i = max(0, bisect.bisect_right(starts, due) - 1)
        while i > 0 and ends_max[i - 1] > due:
            i -= 1
        while i < j:
            t0, dur, cpu, name = calls[i]
            ov = _overlap(t0, t0 + dur, due, sender_start)
            if ov:
                ov_gc = sum(_overlap(g0, g1, max(t0, due), min(t0 + dur, sender_start)) for g0, g1, main in gcs if main)
                ov -= ov_gc
                kind = "running" if t0 < due else "queued"
                parts[kind] += ov
                by_label[kind][name] += ov
                offcpu[kind] += ov * max(0.0, 1 - cpu / dur) if dur else 0
                covered += ov
            i += 1
        idle = max(0, sender_start - due - covered)
        parts["idle"] += idle
        writes = [(w0, w0 + wd) for w0, wd, _ in trace_writes if _overlap(w0, w0 + wd, due, send)]
        if writes:
            overlaps["part write"] += 1
            idle_in_write += idle
    total = sum(s - d for d, s in late) * 1e9 or 1.0
    top = lambda d: [(n, round(v / 1e6, 1)) for n, v in sorted(d.items(), key=lambda x: -x[1])[:6]]  # noqa: E731
    return {
        "late": len(late),
        "sends": len(sends),
        "far_behind (not attributed)": far,
        "late_slip_ms": round(total / 1e6, 1),
        "share_pct": {k: round(100 * v / total, 1) for k, v in parts.items()},
        "offcpu_ms (loop thread off its CPU or waiting for the GIL)": {k: round(v / 1e6, 1) for k, v in offcpu.items()},
        "idle_ms_while_a_part_was_written": round(idle_in_write / 1e6, 1),
        **{f"{k}_ms": top(v) for k, v in by_label.items()},
        "late_sends_overlapping": overlaps,
        "longest_callbacks_ms": [(n, round(d / 1e6, 2)) for n, d in sorted(max_cb.items(), key=lambda x: -x[1])[:8]],
        "gcs [count, max ms]": {
            f"gen{g}": [
                sum(1 for x in trace_gcs if x[2] == g),
                round(max([x[1] for x in trace_gcs if x[2] == g] or [0]) / 1e6, 2),
            ]
            for g in (0, 1, 2)
        },
        "part_writes [wall ms, thread CPU ms]": [(round(d / 1e6, 1), round(c / 1e6, 1)) for _, d, c in trace_writes],
    }


def _schedstat() -> tuple[int, int]:
    """The loop thread's ns on a CPU and ns runnable but waiting for one (Linux schedstat; zeros elsewhere)."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            run, wait, _ = f.read().split()
        return int(run), int(wait)
    except OSError:
        return 0, 0


def child(a: argparse.Namespace) -> None:
    """One level in this process (pinned by the parent); prints one JSON line."""
    sys.path.insert(0, str(a.tree))
    sys.path.insert(0, str(a.tree / "benchmarks"))
    import numpy as np
    import uvloop
    from rig_generator import plan_for  # the same plan rig_generator.py and loadgen_vs_vllm.py (b) use

    from rig.loadgen.drive import PointRun, make_session
    from rig.results import PartWriter

    trace = Trace()
    if a.trace:
        write = PartWriter.write

        def timed_write(self, *args):  # type: ignore[no-untyped-def]
            t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            try:
                return write(self, *args)
            finally:
                trace.writes.append((t0, time.perf_counter_ns() - t0, time.thread_time_ns() - c0))

        PartWriter.write = timed_write  # type: ignore[method-assign]
        gc.callbacks.append(trace.on_gc)
    ns = argparse.Namespace(
        mode="poisson",
        rate=a.rate,
        requests=int(a.rate * a.level_s),
        max_tokens=16,
        index=0,
        of=1,
        seed=a.seed,
        url=a.url,
        concurrency=0,
    )
    plan = plan_for(ns)

    async def level() -> dict:
        run = PointRun(plan, a.out, "bench", clock_offset_s=0.0)
        async with make_session("lean") as http:
            t0 = os.times()
            sched0 = _schedstat()
            report = await run.run(http, time.perf_counter() + 1.0)
            sched1 = _schedstat()
            cpu = sum(os.times()[:2]) - sum(t0[:2])
            opened = http.opened
        slips = np.asarray([s - d for d, s in run.first_sends])
        out = {
            "slip_p50_ms": float(np.percentile(slips, 50) * 1e3),
            "slip_p99_ms": float(np.percentile(slips, 99) * 1e3),
            "slip_p999_ms": float(np.percentile(slips, 99.9) * 1e3),
            "slip_max_ms": float(slips.max() * 1e3),
            "over_1ms": int((slips > 1e-3).sum()),
            "rate_ratio": report.rate_ratio,
            "ok": report.records.ok,
            "scheduled": report.scheduled,
            "rows_written": report.rows_written,
            "cpu_s": cpu,
            "loop_waited_for_cpu_pct": round(100 * (sched1[1] - sched0[1]) / 1e9 / report.window_s, 2),
            "switchinterval": sys.getswitchinterval(),
            "connections_opened": opened,
        }
        if a.trace:  # the parent attributes the slip (not on the pinned CPU)
            a.dump.write_bytes(pickle.dumps((trace.calls(), trace.gcs, trace.writes, list(run.first_sends))))
        return out

    if a.trace:
        loop = tracing_loop(trace)
        asyncio.set_event_loop(loop)
        result = loop.run_until_complete(level())
        loop.close()
    else:
        result = uvloop.run(level())
    print(json.dumps(result), flush=True)


def parent(a: argparse.Namespace) -> None:
    sys.path.insert(0, str(HERE))
    from truth_server import TruthServer

    print(
        f"{time.strftime('%H:%M:%S', time.gmtime())} UTC, load average "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; rate {a.rate:g}/s, {a.level_s:g} s, tree {a.tree}, "
        f"{'traced' if a.trace else 'untraced'}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="rig-slip-") as tmp:
        srv = TruthServer(Path(tmp) / "truth", itl_ms=0, workers=1, cpus="1")
        try:
            for rep in range(a.repeats):
                cmd = [
                    "taskset",
                    "-c",
                    "0",
                    sys.executable,
                    __file__,
                    "--child",
                    "--url",
                    srv.url,
                    "--out",
                    str(Path(tmp) / f"out{rep}"),
                    "--rate",
                    str(a.rate),
                    "--level-s",
                    str(a.level_s),
                    "--seed",
                    str(rep + 1),
                    "--tree",
                    str(a.tree),
                    "--late-ms",
                    str(a.late_ms),
                ]
                if not a.trace:
                    cmd.append("--no-trace")
                dump = a.dump.with_suffix(f".{rep}.pkl") if a.dump else Path(tmp) / f"trace{rep}.pkl"
                if a.trace:
                    cmd += ["--dump", str(dump)]
                r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
                srv.collect()
                if a.trace:
                    r.update(attribute_calls(*pickle.loads(dump.read_bytes()), a.late_ms / 1e3))
                for k, v in r.items():
                    print(f"  {k}: {json.dumps(v)}")
                print(flush=True)
        finally:
            srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--level-s", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--late-ms", type=float, default=1.0, help="sends later than this are attributed")
    ap.add_argument("--tree", type=Path, default=HERE.parent, help="the checkout whose rig runs (default: this)")
    ap.add_argument("--no-trace", dest="trace", action="store_false")
    ap.add_argument("--dump", type=Path, help="also save the raw trace here (pickle), for a look of your own")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.tree = a.tree.resolve()
    child(a) if a.child else parent(a)


if __name__ == "__main__":
    main()
