"""Running one point on the generators: warm-up, common start, progress, salvage of lost generators, gathering."""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import ray

from rig.contracts import (
    FlushAnswer,
    GeneratorReport,
    GpuSamplerStats,
    RecordCounts,
    ServerConfigEntry,
    ServerGauges,
    Thresholds,
)
from rig.loadgen.plan import GeneratorPlan
from rig.placement import gather_parts
from rig.results import PART_GLOB, atomic_write, requests_dir
from rig.run.context import RunContext
from rig.run.lifecycle import ServerLifecycle, entry_dialect, served_model
from rig.run.live import LiveTracker
from rig.run.plans import build_plans
from rig.run.points import Point
from rig.run.rundir import log_traceback, supersede
from rig.run.statuses import dialect_flags, point_verdict, read_bound_flag
from rig.server.engines import engine_for

STOP_GRACE_S = 4.0  # after a stop request, how long generators may take to return before they are killed
PING_TIMEOUT_S = 10.0  # a generator whose task failed must answer a ping within this to stay in the fleet
KILL_WAIT_S = 10.0  # after ray.kill, how long to wait for the generator to be gone before counting its rows
GATHER_THREADS = 16  # client hosts gathered from at once at the end of a point


def _first_line(e: BaseException) -> str:
    cause = getattr(e, "cause", None) or e
    return ((str(cause).strip().splitlines() or [type(cause).__name__])[0])[:200]


class PointExecutor:
    """Runs points on the fleet against the running server and records each one's outcome in the manifest."""

    def __init__(self, ctx: RunContext, server: ServerLifecycle):
        self.ctx = ctx
        self.server = server

    def run_point(self, p: Point, server_entry: ServerConfigEntry) -> None:
        pid = p.point
        store = self.ctx.store
        if not self.ctx.fleet.active:
            store.update_point(pid, status="failed", error="no load generator left (all died)")
            store.save()
            return
        cfg = p.server
        api = self.ctx.spec.api_for(engine_for(cfg.engine).default_api)
        plans = build_plans(
            self.ctx.spec,
            p,
            str(server_entry.url),
            served_model(cfg, server_entry),
            api,
            [g for g, _ in self.ctx.fleet.active],
            self.ctx.api_key,
            entry_dialect(server_entry),
        )
        planned = [pl.n_requests for pl in plans]
        total = None if None in planned else sum(n or 0 for n in planned)  # None: bound by duration (an open-ended bar)
        # An earlier attempt's error is not this one's (why it runs again stays in ``rerun``).
        store.update_point(pid, status="running", requests_scheduled=0, started_ts=time.time(), api=api, error=None)
        supersede(self.ctx.run_dir, pid)
        store.save()
        self.ctx.progress.status(f"{pid}: warming up")
        handles = [h for _, h in self.ctx.fleet.active]
        warm_ok = self.warm_up(handles, plans)
        store.update_point(pid, warmup_ok=sum(warm_ok))
        if self.ctx.stop.is_set():  # stopped during warm-up: do not start the level
            store.update_point(pid, status="interrupted", ended_ts=time.time())
            store.save()
            return
        server = self.server.handle
        if self.ctx.spec.flush_cache:
            flushed = FlushAnswer.model_validate(ray.get(server.flush_cache.remote()))
            store.update_point(pid, flush_cache=flushed.model_dump())
        before = ray.get(server.metrics_snapshot.remote())
        ray.get(server.start_scrape.remote(self.ctx.spec.run_id, pid, self.ctx.spec.metrics_interval_s))
        lead = self.ctx.fleet.start_lead_s()
        start_wall = time.time() + lead  # common start for every generator (driver clock)
        store.update_point(pid, start_wall=start_wall)
        tel = server_entry.telemetry
        if tel is not None and tel.source:  # a GPU sample at the first send: the energy window's start is bracketed
            server.gpu_sample_at.remote(start_wall + (tel.clock_offset_s or 0.0))
        refs = [g.run_point.remote(start_wall) for g in handles]
        exit_ref = server.wait_exit.remote()
        self.ctx.progress.point_start(pid, total)
        results, server_died = self._watch(pid, plans, refs, exit_ref)
        self._learn_start(pid, lead, results)
        if server_died is None and not ray.get(server.alive.remote()):  # it may have died as the last requests failed
            server_died = ray.get(exit_ref, timeout=5)
        after, metric_parts = self._close_metrics(pid, server_entry, server_died)
        try:
            self.gather(pid, results, metric_parts)
        except Exception as e:
            self._flag(pid, "metrics_unwritten", f"server metrics not copied: {_first_line(e)}")
        # Counter increases over the point's window (warm-up excluded): the server's own token accounting.
        store.update_point(
            pid,
            ended_ts=time.time(),
            window_acceptance=engine_for(cfg.engine).window_acceptance(before, after) if after else None,
            server_counters_delta={k: after[k] - before.get(k, 0.0) for k in sorted(after) if k.endswith("_total")}
            if after
            else None,
        )
        lapse = engine_for(cfg.engine).clock_lapse(before, after) if after else None
        if lapse is not None:  # the figures understate or mistime the modelled hardware: the point is invalid
            self._flag(pid, "sim_behind", lapse)
        self.finish_point(pid, plans, results, server_died)
        self.ctx.progress.point_end(pid, store.entry(pid))

    def _watch(
        self, pid: str, plans: list[GeneratorPlan], refs: list[Any], exit_ref: Any
    ) -> tuple[dict[int, GeneratorReport], int | None]:
        """Wait for the generators' results while watching the server and the stop request; returns each
        generator's report and the server's exit code when it died during the point."""
        results: dict[int, GeneratorReport] = {}
        server_died: int | None = None
        pending = list(refs)
        stop_since: float | None = None
        live = LiveTracker(time.monotonic()) if self.ctx.progress.live else None
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
            for ref in done:
                gid = plans[refs.index(ref)].generator
                try:
                    results[gid] = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    results[gid] = self.salvage(pid, gid, f"generator died: {type(e).__name__}")
                except ray.exceptions.RayTaskError as e:  # its task failed: what it wrote is still on disk
                    # The actor itself may be well (a task, not a process, failed): one that answers stays in the
                    # fleet for the next point; one that does not is killed before its rows are counted.
                    keep = self._answers(gid)
                    results[gid] = self.salvage(pid, gid, f"generator task failed: {_first_line(e)}", keep=keep)
            ready, _ = ray.wait([exit_ref], timeout=0)
            if ready and server_died is None:
                server_died = ray.get(exit_ref)
                self.ctx.fleet.stop_all()
            if self.ctx.stop.is_set():
                if stop_since is None:  # once: each stop call queues on the generators' (maybe swamped) loops
                    stop_since = self.ctx.stop.at or time.monotonic()
                    self.ctx.fleet.stop_all()
                if pending and time.monotonic() - stop_since > STOP_GRACE_S:
                    self._kill(pid, [plans[refs.index(ref)].generator for ref in pending], results)
                    break
            if stop_since is not None:
                continue  # stopping: no progress polls (each waits on a maybe swamped generator)
            self._poll(live)
        return results, server_died

    def _learn_start(self, pid: str, lead: float, results: dict[int, GeneratorReport]) -> None:
        """A start call that came after the common start started its generator late: say so, and lengthen the
        next levels' notice to cover the time the calls took (Fleet.observe_start)."""
        notices = [r.start_notice_s for r in results.values()]
        shortest = self.ctx.fleet.observe_start(lead, notices)
        if shortest is not None and shortest < 0:
            late = sum(1 for n in notices if n is not None and n < 0)
            self.ctx.progress.status(
                f"{pid}: {late} generator(s) got the start call up to {-shortest * 1e3:.0f} ms after the common "
                f"start ({lead:.2f} s of notice); later levels get {self.ctx.fleet.start_lead_s():.2f} s"
            )

    def _poll(self, live: LiveTracker | None) -> None:
        """One progress beat: the generators' counters to the progress bar; with the live view, also their latency
        sketches and the server's last gauges (asked for before the generators, so the two waits overlap)."""
        gauges_ref = self.server.handle.live.remote() if live is not None else None
        progress = self.ctx.fleet.poll_progress()
        counts = progress.counts
        self.ctx.progress.point_update(sum(counts.get(k, 0) for k in ("ok", "failed", "cancelled")), counts)
        if live is None or gauges_ref is None:
            return
        got: Any = None
        with contextlib.suppress(Exception):  # a busy or dead server: no gauges this beat
            got = ray.get(gauges_ref, timeout=1)
        gauges = got if isinstance(got, ServerGauges) else None
        self.ctx.progress.point_live(live.update(time.monotonic(), progress, gauges))

    def _kill(self, pid: str, gids: list[int], results: dict[int, GeneratorReport]) -> None:
        """Generators too busy to stop in time (an overloaded event loop): kill them, then count what reached the
        disk, so the manifest's counts are exactly the rows there."""
        self.ctx.progress.status(
            f"{len(gids)} generator(s) did not stop within {STOP_GRACE_S:g}s: killed; counting their rows on disk"
        )
        self._retire(*gids)
        for gid in gids:
            results[gid] = self.salvage(pid, gid, f"killed: still running {STOP_GRACE_S:g}s after the stop request")
            results[gid].status = "interrupted"  # stopped, by force: not a fault of the point

    def _answers(self, gid: int) -> bool:
        """Whether a generator whose task failed still answers (else it is killed, so it writes nothing more)."""
        try:
            ray.get(self.ctx.fleet.handle(gid).clock.remote(), timeout=PING_TIMEOUT_S)
            return True
        except Exception:
            self._retire(gid)
            return False

    def _retire(self, *gids: int) -> None:
        """Kill generators and wait (bounded, all at once) until they are gone: rows are counted after their last
        write, not during it (ray.kill only asks; a process may finish writing a part meanwhile)."""
        handles = [h for h in map(self.ctx.fleet.handle, gids) if h is not None]
        for h in handles:
            with contextlib.suppress(Exception):
                ray.kill(h)
        deadline = time.monotonic() + KILL_WAIT_S
        while handles and time.monotonic() < deadline:
            pings = [h.clock.remote() for h in handles]
            alive = []
            for h, ref in zip(handles, pings, strict=True):
                try:
                    ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
                    alive.append(h)  # answered: not gone yet
                except ray.exceptions.RayActorError:
                    pass  # dead
                except Exception:  # no answer yet: ask again until the deadline
                    alive.append(h)
            handles = alive
            if handles:
                time.sleep(0.1)

    def _close_metrics(
        self, pid: str, server_entry: ServerConfigEntry, server_died: int | None
    ) -> tuple[dict[str, float], list[str]]:
        """The closing counter snapshot, the scrape's part files and the GPU sampler's figures. What this adds
        to the point is its flag on a fault, never a loss of the generators' results and their accounting."""
        server = self.server.handle
        # A stopped run skips the closing snapshot: a swamped server would hold the stop up for its timeout.
        stopping = self.ctx.stop.is_set()
        after: dict[str, float] = {}
        metric_parts: list[str] = []
        try:
            after = ray.get(server.metrics_snapshot.remote()) if server_died is None and not stopping else {}
            if server_died is None:
                metric_parts = ray.get(server.stop_scrape.remote())
                lost = ray.get(server.scrape_lost.remote())
                if lost:
                    self._flag(pid, "metrics_unwritten", lost)
                if server_entry.telemetry is not None and server_entry.telemetry.source:
                    stats = ray.get(server.gpu_stats.remote())
                    if stats is not None:
                        stats = GpuSamplerStats.model_validate(stats).model_dump()
                    self.ctx.store.update_point(pid, gpu_telemetry=stats)
        except Exception as e:
            self._flag(pid, "metrics_unwritten", f"server metrics not saved: {_first_line(e)}")
        return after, metric_parts

    def _flag(self, pid: str, flag: str, why: str) -> None:
        """A flag with its reason on the point (kept by finish_point's verdict) and on screen."""
        entry = self.ctx.store.entry(pid)
        entry.flag_reasons = {**entry.flag_reasons, flag: why}
        self.ctx.progress.status(f"{pid}: warning: {why}")

    def warm_up(self, handles: list[Any], plans: list[GeneratorPlan]) -> list[int]:
        """Each generator's warm-up (successes per generator), watched like a level: a stop request cancels it, and
        a generator that does not return within STOP_GRACE_S of it is left behind (the point is not run). A blocking
        get here held a Ctrl-C for the request timeout against a server that stalls mid-stream."""
        refs = [g.prepare.remote(pl) for g, pl in zip(handles, plans, strict=True)]
        stop_since: float | None = None
        while True:
            done, pending = ray.wait(refs, num_returns=len(refs), timeout=0.5)
            if not pending:
                break
            if self.ctx.stop.is_set():
                if stop_since is None:
                    stop_since = self.ctx.stop.at or time.monotonic()
                    self.ctx.fleet.stop_all()  # cancels the warm-up requests
                if time.monotonic() - stop_since > STOP_GRACE_S:
                    for ref in pending:
                        with contextlib.suppress(Exception):
                            ray.cancel(ref, force=False)
                    break
        out: list[int] = []
        for ref in refs:
            try:
                out.append(int(ray.get(ref, timeout=0)))
            except Exception:  # not back (stopped) or its generator died: the level's own wait deals with the rest
                if not self.ctx.stop.is_set():
                    raise
                out.append(0)
        return out

    def internal_error(self, pid: str, err: Exception) -> None:
        """Record an unexpected exception on its point (one line) and its traceback in logs/driver.log."""
        log = log_traceback(self.ctx.run_dir, pid)
        kind = type(getattr(err, "cause", None) or err).__name__  # a generator's task failed: the error it raised
        self.ctx.store.update_point(pid, status="failed", error=f"internal error: {kind}: {_first_line(err)}")
        self.ctx.fleet.stop_all()
        self.ctx.store.save()
        self.ctx.progress.status(f"{pid}: internal error ({kind}); traceback in {log}")

    def salvage(self, pid: str, gid: int, why: str, keep: bool = False) -> GeneratorReport:
        """A generator died mid-point (or its task failed): keep what its closed part files hold, count it, and stop
        using it unless ``keep`` (it answers: the next point may use it)."""
        if not keep:
            self.ctx.fleet.drop(gid)
        result = GeneratorReport(generator=gid, status="failed", error=why)
        # Its parts may still be on its host (the node outlives the actor); if its host is gone too, count what
        # reached the results dir.
        with contextlib.suppress(Exception):
            self.gather_one(pid, gid)
        gen_dir = requests_dir(self.ctx.run_dir, pid, gid)
        if gen_dir.exists():
            statuses: list[str] = []
            for part in sorted(gen_dir.glob(PART_GLOB)):
                with contextlib.suppress(OSError, pa.ArrowException):  # a half-written file has no footer
                    statuses += pq.ParquetFile(part).read(columns=["status"]).column("status").to_pylist()
            if statuses:
                result = result.model_copy(
                    update=dict(
                        status="partial",
                        rows_written=len(statuses),
                        scheduled=len(statuses),
                        records=RecordCounts(**{k: statuses.count(k) for k in ("ok", "failed", "cancelled")}),
                        parts=sorted(p.name for p in gen_dir.glob(PART_GLOB)),
                    )
                )
        return result

    def gather(self, pid: str, results: dict[int, GeneratorReport], metric_parts: list[str]) -> None:
        """Bring part files written on other hosts into the run directory (no-op when they are already here)."""

        def host(gens: list[int]) -> list[tuple[int, dict[str, int] | None, str | None]]:
            out: list[tuple[int, dict[str, int] | None, str | None]] = []
            for g in gens:  # one host's generators one after another: its tasks reuse one worker process
                try:
                    out.append((g, self.gather_one(pid, g), None))
                except Exception as e:
                    out.append((g, None, (str(e).strip().splitlines() or [type(e).__name__])[0][:200]))
            return out

        # Hosts answer in parallel: a serial walk costs a few Ray round trips per generator, which at hundreds
        # of generators is minutes per point.
        by_node: dict[Any, list[int]] = {}
        for g, _ in self.ctx.fleet.active:
            info = self.ctx.fleet.info(g)
            by_node.setdefault(info["node_id"] if info else None, []).append(g)
        with ThreadPoolExecutor(max_workers=GATHER_THREADS) as pool:
            for done in pool.map(host, list(by_node.values())):
                for g, counts, why in done:
                    report = results.setdefault(g, GeneratorReport(generator=g))
                    if why is None:
                        report.gathered = counts
                    elif report.error is None:
                        report.error = f"could not gather part files from this generator: {why}"
        for part in metric_parts:
            dest = self.ctx.run_dir / part
            if not dest.exists():
                atomic_write(dest, ray.get(self.server.handle.read_file.remote(part)))

    def gather_one(self, pid: str, gid: int) -> dict[str, int]:
        info = self.ctx.fleet.info(gid)
        if info is None:
            return {}
        rel = str(requests_dir(Path("."), pid, gid))
        return gather_parts(self.ctx.run_dir, rel, info, self.ctx.spec.cluster.results_uri, self.ctx.spec.run_id)

    def finish_point(
        self, pid: str, plans: list[GeneratorPlan], results: dict[int, GeneratorReport], server_died: int | None
    ) -> None:
        """Sum the generators' results into the point's entry and judge it (flags, status)."""
        gens = [
            results.get(pl.generator) or GeneratorReport(generator=pl.generator, status="failed", error="no result")
            for pl in plans
        ]
        records = RecordCounts(**{k: sum(getattr(r.records, k) for r in gens) for k in ("ok", "failed", "cancelled")})
        planned = [pl.n_requests for pl in plans]
        entry = self.ctx.store.entry(pid)
        thresholds = self.ctx.store.data.thresholds or Thresholds()
        flags, status, error = point_verdict(
            gens, records, self.ctx.spec.load.mode, thresholds, server_died, self.ctx.stop.is_set(), entry.flag_reasons
        )
        flags.update(dialect_flags(gens, records.ok, plans[0].dialect if plans else None))
        flags.update(read_bound_flag(gens))
        self.ctx.store.update_point(
            pid,
            generators=gens,
            records=records,
            requests_scheduled=sum(r.scheduled for r in gens),
            requests_planned=None if None in planned else sum(planned),
            status=status,
        )
        entry.set_verdict(flags)
        if error is not None:
            entry.error = error
        self.ctx.store.save()
