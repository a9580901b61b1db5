"""Runs a RunSpec: for each server configuration, launch the server once, run its load points, record everything.

The flow is one-directional: spec -> placement -> server -> load -> records -> (analysis, elsewhere). This module
only orders the steps; each step lives in its own module of rig.run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path

import ray

from rig.config import RunSpec
from rig.contracts import Manifest, PointEntry, ServerConfigEntry
from rig.run.api_key import read_api_key, read_server_env
from rig.run.context import RunContext
from rig.run.errors import RunError
from rig.run.execute import PointExecutor
from rig.run.fleet import Fleet
from rig.run.lifecycle import ServerLifecycle
from rig.run.manifest_store import ManifestStore
from rig.run.points import Point, expand_points
from rig.run.progress import Progress
from rig.run.rundir import RunDirLock, check_output
from rig.run.signals import StopControl, install_signal_handlers
from rig.run.statuses import run_status
from rig.server.actor import ServerError


class Runner:
    def __init__(
        self,
        spec: RunSpec,
        progress: Progress | None = None,
        resume: bool = False,
        handle_signals: bool = False,
        planner: Callable[[Runner], Iterable[Point]] | None = None,
        run_dir: Path | str | None = None,
        redo: frozenset[str] = frozenset(),
    ) -> None:
        self.spec = spec
        self.progress = progress if progress is not None else Progress()
        self.resume = resume
        self.redo = redo  # resuming: complete points carrying one of these flags run again
        self.handle_signals = handle_signals  # SIGINT/SIGTERM stop the run cleanly (the CLI turns this on)
        # Adaptive runs (SLO search, tune): a function of the runner yielding points one at a time; it resumes after
        # the runner has run (or, resuming, skipped as complete) each one, so it can read that point's results first.
        self.planner = planner
        # default spec.run_dir; a resume works on exactly the directory it is given
        self.run_dir: Path = Path(run_dir) if run_dir is not None else spec.run_dir
        self.nothing_to_do = False  # a resumed run whose every point is complete and on disk
        self.points = [] if self.planner is not None else expand_points(self.spec)
        self.stop = StopControl(self.progress.status)
        self.lock = RunDirLock(self.run_dir, self.spec.run_id, self.resume)
        self.store = ManifestStore(self.run_dir, self.spec.load.mode, self.spec.load.profile)
        self.fleet = Fleet()
        self.api_key = read_api_key(self.spec)
        server_env = read_server_env(self.spec, [p.server for p in self.points])
        self.ctx = RunContext(
            self.spec, self.run_dir, self.store, self.progress, self.stop, self.fleet, self.api_key, server_env
        )
        self.server = ServerLifecycle(self.ctx)
        self.executor = PointExecutor(self.ctx, self.server)

    # ---------------------------------------------------------------- what planners and the CLI use
    @property
    def manifest(self) -> Manifest:
        """The run's manifest (planners keep their own section in it, then call save())."""
        return self.store.data

    def entry(self, pid: str) -> PointEntry:
        """The manifest entry of a point (planners read a point's status here)."""
        return self.store.entry(pid)

    def save(self) -> None:
        self.store.save()

    def request_stop(self, reason: str) -> None:
        self.stop.request(reason)

    # ---------------------------------------------------------------- the run
    def _claim_run_dir(self) -> None:
        self.lock.claim()

    def _release_lock(self) -> None:
        self.lock.release()
        self.lock.discard_if_empty()

    def run(self) -> Manifest:
        self._claim_run_dir()
        try:
            return self._run_claimed()
        finally:
            self._release_lock()

    def _setup_cluster(self) -> None:
        def on_connect() -> None:
            if self.handle_signals:  # after ray.init, which installs its own SIGTERM handler in the driver
                install_signal_handlers(self.stop)

        self.store.set_cluster(self.fleet.setup(self.spec, self.run_dir, self.progress, on_connect, self.stop.is_set))
        self.store.save()

    def _run_claimed(self) -> Manifest:
        check_output(self.run_dir)
        if self.resume and self.store.finished_on_disk(self.points, self.redo):
            self.nothing_to_do = True  # leave a finished run exactly as it is (no cluster or clock rewrite)
            return self.manifest
        if self.resume:
            self.store.resume(self.points, self.redo)
        else:
            self.store.create(self.spec, self.points)
        self.store.save()
        done_points = {p.point for p in self.manifest.points if p.status == "complete"}
        todo = [p for p in self.points if p.point not in done_points]
        try:
            self._setup_cluster()
            if self.planner is not None:
                self._run_points(self.planner(self), grid=False)
            else:
                by_config: dict[str, list[Point]] = {}
                for p in todo:
                    by_config.setdefault(p.config_id, []).append(p)
                self._run_points([p for points in by_config.values() for p in points], grid=True)
        except KeyboardInterrupt:
            self.request_stop(self.stop.reason or "interrupted")
        except RunError as e:  # refused or stopped by --fail-fast: the manifest says why
            self.store.set_error(str(e))
            raise
        except Exception as e:  # a bug (a planner's, say): the run is not complete, whatever its points are
            first = (str(e).strip().splitlines() or [""])[0][:200]
            self.store.set_error(f"internal error: {type(e).__name__}: {first}")
            raise
        finally:
            self.stop.finalizing = True  # from here on a second Ctrl-C is ignored: the manifest must be finished
            with contextlib.suppress(Exception, KeyboardInterrupt):
                self._teardown()
            if self.handle_signals:  # ray.shutdown() may have put back the default (fatal) SIGINT handler
                install_signal_handlers(self.stop)
            status = run_status(self.store.point_statuses(), self.manifest.error, self.stop.is_set())
            self.store.close_running_points()
            self.store.finish(status, self.stop.reason or None)
            self.store.save()
            if status == "complete":  # nothing to look up in Ray's logs: do not leave them behind
                self.fleet.remove_session()
        return self.manifest

    def _run_points(self, source: Iterable[Point], grid: bool) -> None:
        """Run points in order, keeping a configuration's server up while its points follow each other; a point
        already complete (a resumed run) is not run again.

        A grid (``grid``: the run's points, grouped by configuration) knows what comes next: when a configuration's
        server does not start or dies, the rest of its points fail at once. A planner's points come one at a time
        (each may depend on the last one's results), so its next point launches the server again."""
        ahead = list(source) if grid else []
        current: str | None = None  # the configuration whose server is up
        server_entry = ServerConfigEntry()
        given_up: set[str] = set()  # grid: configurations whose remaining points are already failed

        try:
            for i, p in enumerate(ahead if grid else source):
                if self.stop.is_set():
                    break
                if p.config_id in given_up:
                    continue
                self._register(p)
                if self.entry(p.point).status == "complete":
                    continue
                if current != p.config_id:
                    self._stop_server(current)
                    current = None
                    if self.stop.is_set():  # stopped while the last engine shut down: launch no other
                        break
                    try:
                        server_entry = self.server.launch(p.server)
                    except (ServerError, ray.exceptions.RayTaskError) as e:
                        first = self._launch_failed(p, e)
                        if grid:
                            self._fail_rest(ahead[i + 1 :], p.config_id, f"server did not start: {first}")
                            given_up.add(p.config_id)
                            self.store.save()
                            self.progress.status(f"server {p.config_id} failed to start: {first}")
                        if self.spec.fail_fast:
                            raise RunError(f"server {p.config_id} failed to start: {first}") from None
                        continue
                    current = p.config_id
                entry = self._run_one(p, server_entry)
                # A grid asks only of a failed point (the flag of an earlier attempt stays on a resumed point).
                if "server_died" in entry.flags and (not grid or entry.status == "failed"):
                    if grid:
                        self._fail_rest(ahead[i + 1 :], p.config_id, "server died earlier")
                        given_up.add(p.config_id)
                    self._stop_server(current)
                    current = None
        finally:
            self._stop_server(current)

    def _stop_server(self, cid: str | None) -> None:
        """Stop the server of configuration ``cid`` (None: none is up), keeping its log."""
        if cid is not None:
            self.server.fetch_log(cid)
            self.server.stop_server()
            self.store.update_server_config(cid, stopped=True)
            self.store.save()

    def _fail_rest(self, rest: list[Point], cid: str, error: str) -> None:
        """Fail the points of configuration ``cid`` among ``rest`` (a grid's points still to come)."""
        for q in rest:
            if q.config_id == cid:
                self.store.update_point(q.point, status="failed", error=error)

    def _register(self, p: Point) -> None:
        """A planner's point joins the run's points (and the manifest) the first time it comes."""
        if not any(q.point == p.point for q in self.points):
            self.points.append(p)
            if not self.store.has_point(p.point):
                self.store.add_point(p)
                self.store.save()

    def _run_one(self, p: Point, server_entry: ServerConfigEntry) -> PointEntry:
        """Run one point; a bug or an unexpected fault fails the point, not the run (unless --fail-fast)."""
        try:
            self.executor.run_point(p, server_entry)
        except (RunError, KeyboardInterrupt):
            raise
        except Exception as e:
            self.executor.internal_error(p.point, e)
        entry = self.entry(p.point)
        if entry.status == "failed" and self.spec.fail_fast:
            raise RunError(f"point {p.point} failed: {entry.error}")
        return entry

    def _launch_failed(self, p: Point, e: ServerError | ray.exceptions.RayTaskError) -> str:
        """Record a server that did not start (on its configuration and the point), fetch its log and stop it;
        returns the error's first line."""
        msg = str(e.cause if isinstance(e, ray.exceptions.RayTaskError) and e.cause else e)
        lines = [line for line in msg.strip().splitlines() if line.strip()]
        first = lines[0] if lines else type(e).__name__
        if len(lines) > 1 and isinstance(e.cause if isinstance(e, ray.exceptions.RayTaskError) else e, ServerError):
            # a ServerError's first line says what happened, the rest is the engine log's tail: the last line is
            # what an engine that exits at once says of why (an unknown flag, a missing model)
            self.progress.status(f"server {p.config_id} log, last lines:\n" + "\n".join(f"  {x}" for x in lines[1:]))
            first = f"{first}; its log ends: {lines[-1].strip()[:300]}"
        self.store.update_server_config(p.config_id, status="failed", error=msg[-2000:])
        self.store.update_point(p.point, status="failed", error=f"server did not start: {first}")
        self.server.fetch_log(p.config_id)
        self.server.stop_server()
        self.store.save()
        return first

    def _teardown(self) -> None:
        if self.stop.is_set():
            self.progress.status("stopping: engine and generators")
        self.server.stop_server()
        self.fleet.close()
