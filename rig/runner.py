"""Runs a RunSpec: for each server configuration, launch the server once, run its load points, record everything.

The flow is one-directional: spec -> placement -> server -> load -> records -> (analysis, elsewhere).
"""

from __future__ import annotations

import contextlib
import json
import os
import traceback
import platform
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import ray

import rig
from rig import cluster
from rig.config import RunSpec
from rig.loadgen.actor import remote_class as generator_class
from rig.loadgen.plan import GeneratorPlan, LazySessions, PointInfo
import pyarrow as pa
import pyarrow.parquet as pq

from rig.results import (REQUESTS_DIR, SERVER_METRICS_DIR, read_manifest, requests_dir, server_log_path,
                         write_manifest)
from rig.server.actor import ServerError
from rig.server.actor import remote_class as server_class
from rig.server.effective import change_lines, effective_config
from rig.server.engines import engine_for
from rig.server.spec import ServerConfig
from rig.workloads import build_sessions, dataset_size, warmup_sessions
from rig.workloads.base import Session
from rig.workloads.spec import WorkloadSpec



LAZY_SESSION_LIMIT = 10_000_000  # global sessions a duration-bound closed-loop level may draw


class RunError(RuntimeError):
    """A run-level failure with a one-line message for the user."""


class RunInputError(RunError):
    """A run refused before it starts because of what the user asked for (the CLI exits 2)."""


MIN_SATURATION_WINDOW_S = 2.0  # as rig.analysis.points: shorter generator windows cannot show saturation
STOP_GRACE_S = 4.0  # after a stop request, how long generators may take to return before they are killed
GATHER_THREADS = 16  # client hosts gathered from at once at the end of a point


@dataclass(frozen=True)
class Point:
    point: str
    server: ServerConfig
    workload: WorkloadSpec
    concurrency: int | None
    rate: float | None
    repeat: int

    @property
    def config_id(self) -> str:
        return self.server.config_id()


def point_id(cfg: ServerConfig, workload: WorkloadSpec, concurrency: int | None, rate: float | None,
             mode: str, repeat: int) -> str:
    """Readable and deterministic, so a resumed sweep finds the same points."""
    level = f"c{concurrency}" if rate is None else f"r{rate:g}" + (f"c{concurrency}" if concurrency else "")
    if mode == "trace":
        level = "trace" + (f"c{concurrency}" if concurrency else "")
    rep = f"-rep{repeat}" if repeat else ""
    return f"{cfg.config_id()}-{workload.name}-{level}{rep}"


def expand_points(spec: RunSpec) -> list[Point]:
    points = []
    for cfg in spec.server_configs():
        for wl in spec.workloads:
            for concurrency, rate in spec.load.levels():
                for rep in range(spec.repeat):
                    pid = point_id(cfg, wl, concurrency, rate, spec.load.mode, rep)
                    points.append(Point(pid, cfg, wl, concurrency, rate, rep))
    return points


def split_closed(sessions: list[Session], concurrency: int, n_gen: int) -> list[tuple[list[Session], int]]:
    """Concurrency C over G generators sums to C; session i goes to slot i mod C, slot s to generator s mod G."""
    out: list[tuple[list[Session], int]] = []
    for g in range(n_gen):
        slots = sum(1 for s in range(concurrency) if s % n_gen == g)
        mine = [sess for i, sess in enumerate(sessions) if (i % concurrency) % n_gen == g]
        out.append((mine, slots))
    return out


def split_open(sessions: list[Session], offsets: list[float], n_gen: int, cap: int | None
               ) -> list[tuple[list[Session], list[float], int | None]]:
    """One global arrival schedule; generator g takes every G-th arrival (its slice keeps absolute offsets)."""
    out = []
    for g in range(n_gen):
        idx = list(range(g, len(sessions), n_gen))
        slot_cap = None if cap is None else max(1, sum(1 for s in range(cap) if s % n_gen == g))
        out.append(([sessions[i] for i in idx], [offsets[i] for i in idx], slot_cap))
    return out


def versions() -> dict[str, str]:
    import aiohttp
    import pyarrow

    return {"rig": rig.__version__, "python": platform.python_version(), "ray": ray.__version__,
            "aiohttp": aiohttp.__version__, "pyarrow": pyarrow.__version__, "platform": platform.platform()}


def read_api_key(spec: RunSpec) -> str | None:
    """From the file or the environment variable named in the spec; never stored anywhere."""
    if spec.api_key_file:
        try:
            return spec.api_key_file.read_text().strip() or None
        except OSError as e:
            raise RunError(f"api_key_file {spec.api_key_file}: {e.strerror}") from None
    return os.environ.get(spec.api_key_env) or None


@dataclass
class Progress:
    """Callbacks the CLI provides to show what is going on (no-ops by default)."""

    status: Callable[[str], None] = lambda msg: None
    point_start: Callable[[str, int | None], None] = lambda point, total: None
    point_update: Callable[[int, dict[str, int]], None] = lambda done, counts: None
    point_end: Callable[[str, dict[str, Any]], None] = lambda point, result: None


@dataclass
class Runner:
    spec: RunSpec
    progress: Progress = field(default_factory=Progress)
    resume: bool = False
    handle_signals: bool = False  # SIGINT/SIGTERM stop the run cleanly (the CLI turns this on)
    # Adaptive runs (SLO search, tune): a function of the runner yielding points one at a time; it resumes after the
    # runner has run (or, resuming, skipped as complete) each one, so it can read that point's results first.
    planner: Callable[["Runner"], Iterable[Point]] | None = None
    run_dir: Path | None = None  # default spec.run_dir; a resume works on exactly the directory it is given

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir) if self.run_dir is not None else self.spec.run_dir
        self.nothing_to_do = False  # a resumed run whose every point is complete and on disk
        self._finalizing = False  # set once the run's final bookkeeping starts (a second signal must not cut it)
        self._lock = None
        self.points = [] if self.planner is not None else expand_points(self.spec)
        self.manifest: dict[str, Any] = {}
        self.stop_requested = threading.Event()
        self.stop_reason = ""
        self.generators: list[Any] = []
        self.active: list[tuple[int, Any]] = []  # (generator id, handle) of generators still alive
        self.gen_info: list[dict[str, Any]] = []
        self.server = None
        self._server_spooled = False  # the server node writes to a local spool the driver copies from
        self.placement: cluster.Placement | None = None
        self.api_key = read_api_key(self.spec)
        self._started_ray = False

    # ---------------------------------------------------------------- manifest
    def _init_manifest(self) -> None:
        if self.resume:
            self.manifest = read_manifest(self.run_dir)
            self._recheck_complete_points()
            self.manifest.pop("error", None)  # the earlier attempt's; this one records its own
            self.manifest["status"] = "running"
            self.manifest.setdefault("resumed", []).append(time.time())
            known = {p["point"] for p in self.manifest["points"]}
            for p in self.points:
                if p.point not in known:
                    self.manifest["points"].append(self._point_entry(p))
        else:
            self.manifest = {
                "run_id": self.spec.run_id,
                "status": "running",
                "created": time.time(),
                "spec": json.loads(self.spec.model_dump_json()),
                "versions": versions(),
                "cluster": {},
                "server_configs": {},
                "points": [self._point_entry(p) for p in self.points],
            }
        self.save()

    def _recheck_complete_points(self) -> None:
        """A point marked complete whose records are no longer all on disk (a part file deleted or cut short) is
        run again: its remaining rows are moved aside by _supersede before it runs."""
        for entry in self.manifest.get("points") or []:
            if entry.get("status") != "complete":
                continue
            want = sum((entry.get("records") or {}).values())
            have = count_rows_on_disk(self.run_dir, entry["point"])
            if have != want:
                entry.update(status="pending", error=f"re-run on resume: {have} of {want} records found on disk")

    def _point_entry(self, p: Point) -> dict[str, Any]:
        return {"point": p.point, "server_config": p.config_id, "engine": p.server.engine,
                "workload": p.workload.name, "steps": p.server.steps, "load_mode": self.spec.load.mode,
                "concurrency": p.concurrency, "rate": p.rate, "repeat": p.repeat, "status": "pending",
                "started_ts": None, "ended_ts": None, "requests_scheduled": 0,
                "records": {"ok": 0, "failed": 0, "cancelled": 0}, "window_acceptance": None,
                "flush_cache": None, "flags": [], "generators": []}

    def _entry(self, pid: str) -> dict[str, Any]:
        return next(p for p in self.manifest["points"] if p["point"] == pid)

    def save(self) -> None:
        write_manifest(self.run_dir, self.manifest)

    # ---------------------------------------------------------------- setup
    def _claim_run_dir(self) -> None:
        """Create the run directory atomically (a new run) and hold an exclusive lock on it for the whole run, so
        an earlier run is never overwritten or merged into and two rig processes never share one directory."""
        import fcntl

        shown = self.run_dir
        if not self.resume:
            try:
                self.run_dir.parent.mkdir(parents=True, exist_ok=True)
                self.run_dir.mkdir()
            except FileExistsError:
                if any(self.run_dir.iterdir()):
                    raise RunInputError(f"{shown} already exists (run id {self.spec.run_id!r} was used before); "
                                        f"choose another --run-id, or continue that run with: rig sweep --resume "
                                        f"{shown}") from None
            except OSError as e:
                raise RunError(f"cannot write results to {shown}: {e.strerror or e}") from None
        try:
            fd = os.open(self.run_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunError(f"cannot write results to {shown}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RunInputError(f"{shown} is in use by another rig process (pid {holder}); wait for it to end or "
                                f"choose another --run-id") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock = fd
        if not self.resume and (self.run_dir / "manifest.json").exists():  # another run claimed it just before us
            self._release_lock()
            raise RunInputError(f"{shown} already exists (run id {self.spec.run_id!r} was used before); choose "
                                f"another --run-id, or continue that run with: rig sweep --resume {shown}")

    def _release_lock(self) -> None:
        if self._lock is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock)
            self._lock = None

    def _check_output(self) -> None:
        try:
            probe = self.run_dir / ".write-probe"
            probe.write_bytes(b"x" * 4096)
            probe.unlink()
        except OSError as e:
            raise RunError(f"cannot write results to {self.run_dir}: {e.strerror or e}") from None
        free = shutil.disk_usage(self.run_dir).free
        if free < 64 * 2**20:
            raise RunError(f"only {free / 2**20:.0f} MiB free at {self.run_dir}; need at least 64 MiB")

    def _setup_cluster(self) -> None:
        n = self.spec.clients
        self._started_ray = not ray.is_initialized()
        self.progress.status("starting Ray" if self.spec.cluster.address is None else
                             f"connecting to Ray at {self.spec.cluster.address}")
        try:
            layout = cluster.connect(self.spec.cluster, n)
            if self.handle_signals:  # after ray.init, which installs its own SIGTERM handler in the driver
                install_signal_handlers(self)
            gpus = max(engine_for(c.engine).num_gpus(c) for c in self.spec.server_configs())
            self.placement = cluster.plan_placement(self.spec.cluster, layout["nodes"], gpus, n)
            Gen = generator_class()
            out_root = str(self.run_dir.resolve())
            self.generators = [Gen.options(**opts).remote(i, out_root)
                               for i, opts in enumerate(self.placement.generator_options)]
            self.active = list(enumerate(self.generators))
            self.gen_info = cluster.wait_started(self.generators, self.spec.cluster.placement_timeout_s)
            cluster.verify_generators(self.placement, self.gen_info)
            cluster.set_outputs(self.spec.cluster, self.run_dir, self.spec.run_id, self.generators, self.gen_info)
        except cluster.ClusterError as e:
            raise RunError(str(e)) from None
        corpus = self._check_corpus()
        for g, info in zip(self.generators, self.gen_info):
            # offset = generator clock - driver clock; every record carries it (driver time = ts - offset)
            offset, rtt = cluster.measure_clock_offset(g)
            info["clock_offset_s"], info["clock_rtt_s"] = offset, rtt
            ray.get(g.set_clock_offset.remote(offset))
        self.manifest["cluster"] = {**layout, "local": self.placement.local, "generators": self.gen_info,
                                    "hosts": cluster.host_clocks(self.gen_info),
                                    "server_node": self.placement.server_node,
                                    "results_uri": self.spec.cluster.results_uri, "corpus": corpus}
        self.save()

    def _check_corpus(self) -> dict[str, Any] | None:
        """Record the prompt corpus each host would quote; refuse to start when they differ (the driver builds
        fixed-count levels, generators build duration-bound ones: one seed must mean the same requests)."""
        from rig.workloads import WorkloadError, corpus_fingerprints

        try:
            here = corpus_fingerprints(self.spec.workloads)
        except WorkloadError as e:
            raise RunInputError(str(e)) from None
        if not here:
            return None
        seen = {"driver": here}
        for info, fp in zip(self.gen_info, ray.get([g.corpus.remote(self.spec.workloads) for g in self.generators])):
            seen[f"generator {info['generator']} ({info.get('host')})"] = fp
        why = corpus_mismatch(seen)
        if why:
            raise RunInputError(why)
        return seen

    # ---------------------------------------------------------------- server
    def _launch_server(self, cfg: ServerConfig) -> dict[str, Any]:
        Server = server_class()
        log_rel = str(server_log_path(Path("."), cfg.config_id()))
        c = self.spec.cluster
        # The server node writes where it can: the run directory on one machine or a shared filesystem, else a
        # local spool; the driver fetches the log and metrics parts through Ray (_fetch_log, _gather).
        self._server_spooled = not (self.placement.local or c.shared_results)
        root = f"{c.spool_dir.rstrip('/')}/{self.spec.run_id}/server" if self._server_spooled \
            else str(self.run_dir.resolve())
        if self.placement.local and cfg.host is None:
            # The embedded default is one machine: the engine listens on loopback only (not the LAN), and the
            # generators reach it there. Multi-host placement binds the node's address as before.
            cfg = cfg.model_copy(update={"host": "127.0.0.1"})
        self.server = Server.options(**self.placement.server_options).remote(cfg, root, log_rel, self.api_key)
        entry: dict[str, Any] = {"engine": cfg.engine, "knobs": cfg.knobs(), "status": "starting", "error": None}
        self.manifest["server_configs"][cfg.config_id()] = entry
        started = ray.get(self.server.start.remote())
        entry.update(command=started["command"], url=started["url"], node_ip=started.get("node_ip"),
                     gpu_ids=started.get("gpu_ids"))
        self.save()
        self.progress.status(f"waiting for {cfg.engine} (steps={cfg.steps}) to be healthy at {started['url']}")
        ready_ref = self.server.wait_ready.remote()
        next_note = time.monotonic() + 10
        while True:
            done, _ = ray.wait([ready_ref], timeout=0.5)
            if done:
                break
            if self.stop_requested.is_set():
                raise KeyboardInterrupt
            if time.monotonic() >= next_note:  # a model load takes minutes: say what the wait sees
                next_note += 10
                with contextlib.suppress(Exception):
                    w = ray.get(self.server.wait_progress.remote(), timeout=2)
                    self.progress.status(f"still waiting for {cfg.engine} at {started['url']}: "
                                         f"{w['elapsed_s']:.0f}s, last: {w['last']}")
        ready = ray.get(ready_ref)  # raises ServerError wrapped by Ray if the engine died
        desc = ray.get(self.server.describe.remote())
        info = desc["info"]
        entry.update(status="ready", ready_after_s=ready["ready_after_s"], startup=desc["startup"],
                     server_info=info.get("/server_info"), model_info=info.get("/model_info"), info=info)
        # What the server really runs (it may change requested values) and whether it honours per-request seeds.
        entry["effective"] = effective_config(cfg, entry["server_info"], desc["startup"])
        entry["warnings"] = change_lines(cfg.config_id(), entry["effective"])
        for w in entry["warnings"]:
            self.progress.status(f"warning: {w}")
        self.save()
        return entry

    def _engine_grace(self) -> float:
        """Seconds the engine gets to exit on SIGTERM: less when the user asked the run to stop."""
        return 5.0 if self.stop_requested.is_set() else 30.0

    def _stop_server(self) -> None:
        if self.server is None:
            return
        try:
            ray.get(self.server.stop.remote(self._engine_grace()), timeout=60)
        except Exception:  # already dead
            pass
        try:
            ray.kill(self.server)
        except Exception:
            pass
        self.server = None

    def _served_model(self, cfg: ServerConfig, entry: dict[str, Any]) -> str:
        if cfg.served_model_name:
            return cfg.served_model_name
        models = (entry.get("info") or {}).get("/v1/models") or {}
        try:
            return models["data"][0]["id"]
        except (KeyError, IndexError, TypeError):
            return cfg.model

    # ---------------------------------------------------------------- one point
    def _sessions(self, p: Point) -> tuple[list[Session], list[float] | None]:
        load = self.spec.load
        n = load.requests_for(p.concurrency, p.rate)
        if load.mode == "closed":
            if n is None:  # duration-bound: each generator builds its share lazily (see _plans)
                return [], None
            return build_sessions(p.workload, seed=load.seed, n_sessions=n), None
        from rig.loadgen import arrivals

        if load.mode == "trace":
            if p.workload.name != "dataset":
                raise RunError("trace replay needs the dataset workload (a file whose records carry 'timestamp')")
            sessions = build_sessions(p.workload, seed=load.seed, n_sessions=n or dataset_size(p.workload) or 0)
            stamps = [s.arrival_s for s in sessions]
            if any(t is None for t in stamps):
                raise RunError("trace replay needs a dataset whose records carry 'timestamp'")
            offsets = list(arrivals.trace_offsets(stamps, speed=load.trace_speed))
            return sessions, offsets
        if n is None:
            n = max(1, int((p.rate or 1) * (load.duration_s or 60) * 1.5) + 16)
        offsets = list(arrivals.arrival_offsets(load.mode, rate=p.rate, n=n, seed=load.seed,
                                                burstiness=load.burstiness))
        if load.duration_s:
            offsets = [o for o in offsets if o < load.duration_s]
        return build_sessions(p.workload, seed=load.seed, n_sessions=len(offsets)), offsets

    def _plans(self, p: Point, url: str, model: str, api: str) -> list[GeneratorPlan]:
        load = self.spec.load
        info = PointInfo(run_id=self.spec.run_id, point=p.point, engine=p.server.engine, workload=p.workload.name,
                         api=api, steps=p.server.steps, server_config=p.config_id,
                         server_args=json.dumps(p.server.knobs(), sort_keys=True), load_mode=load.mode,
                         concurrency=p.concurrency, rate=p.rate, repeat=p.repeat)
        sessions, offsets = self._sessions(p)
        n_gen = len(self.active)
        # Warm-up content differs from the measured requests (it must not pre-fill the prefix cache for them).
        warm = [_shorten(s) for s in warmup_sessions(p.workload, seed=load.seed, n_sessions=load.warmup_requests)]
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        common = dict(point=info, url=url, model=model, duration_s=load.duration_s, grace_s=load.grace_s,
                      warmup=tuple(warm),
                      connect_s=load.timeouts.connect_s, first_token_s=load.timeouts.first_token_s,
                      total_s=load.timeouts.total_s, slip_threshold_s=load.slip_threshold_s, extra_headers=headers)
        ids = [g for g, _ in self.active]
        conc = p.concurrency or 1
        if offsets is None and load.requests_for(p.concurrency, p.rate) is None:
            # Bound by duration: no session list crosses Ray; generators build theirs as they go.
            return [GeneratorPlan(generator=ids[i], sessions=(), slots=slots, lazy=LazySessions(
                        p.workload, load.seed, conc, n_gen, i, limit=LAZY_SESSION_LIMIT), **common)
                    for i, (_, slots) in enumerate(split_closed([], conc, n_gen))]
        if offsets is None:
            return [GeneratorPlan(generator=ids[i], sessions=tuple(mine), slots=slots, **common)
                    for i, (mine, slots) in enumerate(split_closed(sessions, p.concurrency or 1, n_gen))]
        return [GeneratorPlan(generator=ids[i], sessions=tuple(mine), arrivals=tuple(offs), slots=cap, **common)
                for i, (mine, offs, cap) in enumerate(split_open(sessions, offsets, n_gen, p.concurrency))]

    def _run_point(self, p: Point, server_entry: dict[str, Any]) -> None:
        entry = self._entry(p.point)
        if not self.active:
            entry.update(status="failed", error="no load generator left (all died)")
            self.save()
            return
        cfg = p.server
        api = self.spec.api_for(engine_for(cfg.engine).default_api)
        plans = self._plans(p, server_entry["url"], self._served_model(cfg, server_entry), api)
        planned = [pl.n_requests for pl in plans]
        total = None if None in planned else sum(planned)  # None: bound by duration (an open-ended bar)
        entry.update(status="running", requests_scheduled=0, started_ts=time.time(), api=api)
        self._supersede(p.point)
        self.save()
        self.progress.status(f"{p.point}: warming up")
        handles = [h for _, h in self.active]
        warm_ok = ray.get([g.prepare.remote(pl) for g, pl in zip(handles, plans)])
        entry["warmup_ok"] = sum(warm_ok)
        if self.stop_requested.is_set():  # stopped during warm-up: do not start the level
            entry.update(status="interrupted", ended_ts=time.time())
            self.save()
            return
        if self.spec.flush_cache:
            entry["flush_cache"] = ray.get(self.server.flush_cache.remote())
        before = ray.get(self.server.metrics_snapshot.remote())
        ray.get(self.server.start_scrape.remote(self.spec.run_id, p.point, self.spec.metrics_interval_s))
        start_wall = time.time() + 1.0  # common start for every generator (driver clock)
        entry["start_wall"] = start_wall
        refs = [g.run_point.remote(start_wall) for g in handles]
        exit_ref = self.server.wait_exit.remote()
        self.progress.point_start(p.point, total)
        results: dict[int, dict[str, Any]] = {}
        server_died: int | None = None
        pending = list(refs)
        stop_since: float | None = None
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
            for ref in done:
                gid = plans[refs.index(ref)].generator
                try:
                    results[gid] = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    results[gid] = self._salvage(p.point, gid, f"generator died: {type(e).__name__}")
                except ray.exceptions.RayTaskError as e:  # its task failed: what it wrote is still on disk
                    results[gid] = self._salvage(p.point, gid, f"generator task failed: {_first_line(e)}")
            ready, _ = ray.wait([exit_ref], timeout=0)
            if ready and server_died is None:
                server_died = ray.get(exit_ref)
                self._stop_generators()
            if self.stop_requested.is_set():
                if stop_since is None:  # once: each stop call queues on the generators' (maybe swamped) loops
                    stop_since = getattr(self, "stop_at", None) or time.monotonic()
                    self._stop_generators()
                if pending and time.monotonic() - stop_since > STOP_GRACE_S:
                    # Too busy to stop in time (an overloaded event loop): kill them, then count what reached
                    # the disk, so the manifest's counts are exactly the rows there.
                    self.progress.status(f"{len(pending)} generator(s) did not stop within {STOP_GRACE_S:g}s: "
                                         f"killed; counting their rows on disk")
                    for ref in pending:
                        gid = plans[refs.index(ref)].generator
                        handle = next((h for g, h in self.active if g == gid), None)
                        with contextlib.suppress(Exception):
                            ray.kill(handle)
                        results[gid] = self._salvage(p.point, gid, f"killed: still running {STOP_GRACE_S:g}s after "
                                                     f"the stop request")
                        results[gid]["status"] = "interrupted"  # stopped, by force: not a fault of the point
                    pending = []
                    break
            if stop_since is not None:
                continue  # stopping: no progress polls (each waits on a maybe swamped generator)
            counts = self._poll_progress()
            self.progress.point_update(sum(counts.get(k, 0) for k in ("ok", "failed", "cancelled")), counts)
        if server_died is None:  # it may have died just as the last requests failed against it
            if not ray.get(self.server.alive.remote()):
                server_died = ray.get(exit_ref, timeout=5)
        # A stopped run skips the closing snapshot: a swamped server would hold the stop up for its timeout.
        stopping = self.stop_requested.is_set()
        after = ray.get(self.server.metrics_snapshot.remote()) if server_died is None and not stopping else {}
        metric_parts = ray.get(self.server.stop_scrape.remote()) if server_died is None else []
        self._gather(p.point, results, metric_parts)
        entry["ended_ts"] = time.time()
        entry["window_acceptance"] = engine_for(cfg.engine).window_acceptance(before, after) if after else None
        # Counter increases over the point's window (warm-up excluded): the server's own token accounting.
        entry["server_counters_delta"] = {k: after[k] - before.get(k, 0.0) for k in sorted(after)
                                          if k.endswith("_total")} if after else None
        self._finish_point(entry, plans, results, server_died)
        self.progress.point_end(p.point, entry)

    def _internal_error(self, pid: str, err: Exception) -> None:
        """Record an unexpected exception on its point (one line) and its traceback in logs/driver.log."""
        log = self.run_dir / "logs" / "driver.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as f:
            f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} point {pid}\n{traceback.format_exc()}\n")
        self._entry(pid).update(status="failed", error=f"internal error: {type(err).__name__}: {err}"[:500])
        self._stop_generators()
        self.save()
        self.progress.status(f"{pid}: internal error ({type(err).__name__}); traceback in {log}")

    def _salvage(self, pid: str, gid: int, why: str) -> dict[str, Any]:
        """A generator died mid-point: keep what its closed part files hold, count it, and stop using it."""
        self.active = [(g, h) for g, h in self.active if g != gid]
        result: dict[str, Any] = {"generator": gid, "status": "failed", "error": why, "rows_written": 0,
                                  "records": {"ok": 0, "failed": 0, "cancelled": 0}, "scheduled": 0}
        try:
            self._gather_one(pid, gid)  # its parts may still be on its host (the node outlives the actor)
        except Exception:
            pass  # its host is gone too: count what reached the results dir
        gen_dir = requests_dir(self.run_dir, pid, gid)
        if gen_dir.exists():
            statuses: list[str] = []
            for part in sorted(gen_dir.glob("part-*.parquet")):
                with contextlib.suppress(OSError, pa.ArrowException):  # a half-written file has no footer
                    statuses += pq.ParquetFile(part).read(columns=["status"]).column("status").to_pylist()
            if statuses:
                result.update(status="partial", rows_written=len(statuses), scheduled=len(statuses),
                              records={k: statuses.count(k) for k in ("ok", "failed", "cancelled")},
                              parts=sorted(p.name for p in gen_dir.glob("part-*.parquet")))
        return result

    def _supersede(self, pid: str) -> None:
        """Before (re)running a point, move any rows of an earlier unfinished attempt aside (no duplicates)."""
        for sub in (REQUESTS_DIR, SERVER_METRICS_DIR):
            old = self.run_dir / sub / f"point={pid}"
            if old.exists():
                dest = self.run_dir / "superseded" / time.strftime("%Y%m%d-%H%M%S") / sub / f"point={pid}"
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(old, dest)

    def _stop_generators(self) -> None:
        for _, g in self.active:
            try:
                g.stop.remote()
            except Exception:
                pass

    def _poll_progress(self) -> dict[str, int]:
        total: dict[str, int] = {}
        refs = [g.progress.remote() for _, g in self.active]
        for ref in refs:
            try:
                for k, v in ray.get(ref, timeout=1).items():  # a busy generator: skip a beat
                    total[k] = total.get(k, 0) + v
            except Exception:
                pass
        return total

    def _gather(self, pid: str, results: dict[int, dict[str, Any]], metric_parts: list[str]) -> None:
        """Bring part files written on other hosts into the run directory (no-op when they are already here)."""
        def host(gens: list[int]) -> list[tuple[int, dict[str, int] | None, str | None]]:
            out = []
            for g in gens:  # one host's generators one after another: its tasks reuse one worker process
                try:
                    out.append((g, self._gather_one(pid, g), None))
                except Exception as e:
                    out.append((g, None, (str(e).strip().splitlines() or [type(e).__name__])[0][:200]))
            return out

        # Hosts answer in parallel: a serial walk costs a few Ray round trips per generator, which at hundreds
        # of generators is minutes per point.
        by_node: dict[Any, list[int]] = {}
        for g, _ in self.active:
            info = next((i for i in self.gen_info if i["generator"] == g), {})
            by_node.setdefault(info.get("node_id"), []).append(g)
        with ThreadPoolExecutor(max_workers=GATHER_THREADS) as pool:
            for done in pool.map(host, list(by_node.values())):
                for g, counts, why in done:
                    if why is None:
                        results.setdefault(g, {})["gathered"] = counts
                    else:
                        results.setdefault(g, {}).setdefault(
                            "error", f"could not gather part files from this generator: {why}")
        for part in metric_parts:
            dest = self.run_dir / part
            if not dest.exists():
                _write_bytes(dest, ray.get(self.server.read_file.remote(part)))

    def _gather_one(self, pid: str, gid: int) -> dict[str, int]:
        info = next((i for i in self.gen_info if i["generator"] == gid), None)
        if info is None:
            return {}
        rel = str(requests_dir(Path("."), pid, gid))
        return cluster.gather_parts(self.run_dir, rel, info, self.spec.cluster.results_uri, self.spec.run_id)

    def _finish_point(self, entry: dict[str, Any], plans: list[GeneratorPlan], results: dict[int, dict[str, Any]],
                      server_died: int | None) -> None:
        gens = [results.get(pl.generator, {"generator": pl.generator, "status": "failed", "error": "no result"})
                for pl in plans]
        entry["generators"] = gens
        records = {"ok": 0, "failed": 0, "cancelled": 0}
        scheduled = 0
        for r in gens:
            for k in records:
                records[k] += (r.get("records") or {}).get(k, 0)
            scheduled += r.get("scheduled", 0)
        entry["records"] = records
        entry["requests_scheduled"] = scheduled
        planned = [pl.n_requests for pl in plans]
        entry["requests_planned"] = None if None in planned else sum(planned)
        flags = set(entry.get("flags") or [])
        load = self.spec.load
        for r in gens:
            if r.get("status") == "failed" or "died" in (r.get("error") or ""):
                flags.add("generator_lost")
            # a lag percentile over a blink of time (every request failing in milliseconds) is not evidence
            if (r.get("loop_lag_p99_ms") or 0) > load.loop_lag_threshold_s * 1e3 and \
                    (r.get("window_s") is None or r["window_s"] >= MIN_SATURATION_WINDOW_S):
                flags.add("client_saturated")
            if load.mode != "closed" and (r.get("slip_p99_s") or 0) > load.slip_threshold_s:
                flags.update({"schedule_slip", "client_saturated"})
            if load.mode != "closed" and (r.get("rate_ratio") or 1.0) < 0.99:  # achieved < 99 % of the schedule
                flags.update({"rate_shortfall", "client_saturated"})
        if server_died is not None:
            flags.add("server_died")
        entry["flags"] = sorted(flags)
        if server_died is not None:
            entry["status"] = "failed"
            entry["error"] = f"server exited with code {server_died} during the point"
        elif all(r.get("status") == "failed" for r in gens):
            entry["status"] = "failed"
            entry["error"] = "every generator failed: " + "; ".join(str(r.get("error")) for r in gens)
        elif self.stop_requested.is_set():
            entry["status"] = "interrupted"
        elif records["ok"] == 0 and records["failed"] > 0:
            entry["status"] = "failed"
            entry["error"] = f"no request succeeded ({records['failed']} failed)"
        elif any(r.get("status") != "complete" for r in gens) or records["ok"] == 0:
            entry["status"] = "partial"
        else:
            entry["status"] = "complete"
        self.save()

    # ---------------------------------------------------------------- the run
    def request_stop(self, reason: str) -> None:
        if not self.stop_requested.is_set():
            self.stop_at = time.monotonic()
            self.progress.status(f"stopping ({reason}): in-flight requests are recorded as cancelled")
        self.stop_reason = reason
        self.stop_requested.set()

    def run(self) -> dict[str, Any]:
        self._claim_run_dir()
        try:
            return self._run_claimed()
        finally:
            self._release_lock()

    def _run_claimed(self) -> dict[str, Any]:
        self._check_output()
        if self.resume and self._all_done():
            self.nothing_to_do = True  # leave a finished run exactly as it is (no cluster or clock rewrite)
            return self.manifest
        self._init_manifest()
        done_points = {p["point"] for p in self.manifest["points"] if p["status"] == "complete"}
        todo = [p for p in self.points if p.point not in done_points]
        status = "complete"
        try:
            self._setup_cluster()
            if self.planner is not None:
                self._run_planned(iter(self.planner(self)))
                todo = []
            by_config: dict[str, list[Point]] = {}
            for p in todo:
                by_config.setdefault(p.config_id, []).append(p)
            for config_id, points in by_config.items():
                if self.stop_requested.is_set():
                    break
                cfg = points[0].server
                try:
                    server_entry = self._launch_server(cfg)
                except (ServerError, ray.exceptions.RayTaskError) as e:
                    msg = str(e.cause if isinstance(e, ray.exceptions.RayTaskError) and e.cause else e)
                    first = msg.strip().splitlines()[0] if msg.strip() else type(e).__name__
                    self.manifest["server_configs"][config_id].update(status="failed", error=msg[-2000:])
                    for p in points:
                        self._entry(p.point).update(status="failed", error=f"server did not start: {first}")
                    self._fetch_log(config_id)
                    self._stop_server()
                    self.save()
                    self.progress.status(f"server {config_id} failed to start: {first}")
                    if self.spec.fail_fast:
                        raise RunError(f"server {config_id} failed to start: {first}")
                    continue
                try:
                    for p in points:
                        if self.stop_requested.is_set():
                            break
                        try:
                            self._run_point(p, server_entry)
                        except (RunError, KeyboardInterrupt):
                            raise
                        except Exception as e:  # a bug or an unexpected fault: fail this point, keep the run
                            self._internal_error(p.point, e)
                        if self._entry(p.point)["status"] == "failed":
                            if self.spec.fail_fast:
                                raise RunError(f"point {p.point} failed: {self._entry(p.point).get('error')}")
                            if "server_died" in self._entry(p.point)["flags"]:
                                for rest in points[points.index(p) + 1:]:
                                    self._entry(rest.point).update(status="failed", error="server died earlier")
                                break
                finally:
                    self._fetch_log(config_id)
                    self._stop_server()
                    self.manifest["server_configs"][config_id]["stopped"] = True
                    self.save()
        except KeyboardInterrupt:
            self.request_stop(self.stop_reason or "interrupted")
        except RunError as e:  # refused or stopped by --fail-fast: the manifest says why
            self.manifest["error"] = str(e)
            raise
        finally:
            self._finalizing = True  # from here on a second Ctrl-C is ignored: the manifest must be finished
            with contextlib.suppress(Exception, KeyboardInterrupt):
                self._teardown()
            if self.handle_signals:  # ray.shutdown() may have put back the default (fatal) SIGINT handler
                install_signal_handlers(self)
            if self.stop_requested.is_set():
                status = "interrupted"
            states = [p["status"] for p in self.manifest["points"]]
            if status != "interrupted":
                if self.manifest.get("error"):
                    status = "failed"
                elif all(s == "complete" for s in states):
                    status = "complete"
                elif all(s == "failed" for s in states):
                    status = "failed"
                else:
                    status = "partial"
            for p in self.manifest["points"]:
                if p["status"] == "running":
                    # Cut off before its generators reported: count what reached the disk (they are dead now,
                    # so nothing is written after this count).
                    records = rows_by_status(self.run_dir, p["point"])
                    p.update(status="interrupted", records=records, requests_scheduled=sum(records.values()),
                             ended_ts=p.get("ended_ts") or time.time())
            self.manifest["status"] = status
            self.manifest["stop_reason"] = self.stop_reason or None
            self.manifest["finished"] = time.time()
            self.save()
        return self.manifest

    def _all_done(self) -> bool:
        """A resume with nothing left: the run completed and every point's records are on disk."""
        try:
            m = read_manifest(self.run_dir)
        except (FileNotFoundError, ValueError):
            return False
        entries = {p["point"]: p for p in m.get("points") or []}
        if m.get("status") != "complete" or any(p.point not in entries for p in self.points):
            return False
        self.manifest = m
        return all(e["status"] == "complete" and count_rows_on_disk(self.run_dir, e["point"])
                   == sum((e.get("records") or {}).values()) for e in entries.values())

    def entry(self, pid: str) -> dict[str, Any]:
        """The manifest entry of a point (planners read a point's status here)."""
        return self._entry(pid)

    def _run_planned(self, source: Iterator[Point]) -> None:
        """Run the planner's points as they come, keeping a configuration's server up while its points follow each
        other; a point already complete (a resumed run) is not run again."""
        current: str | None = None
        server_entry: dict[str, Any] = {}

        def stop_current() -> None:
            if current is not None:
                self._fetch_log(current)
                self._stop_server()
                self.manifest["server_configs"][current]["stopped"] = True
                self.save()

        try:
            for p in source:
                if self.stop_requested.is_set():
                    break
                if not any(q.point == p.point for q in self.points):
                    self.points.append(p)
                    if not any(e["point"] == p.point for e in self.manifest["points"]):
                        self.manifest["points"].append(self._point_entry(p))
                        self.save()
                if self._entry(p.point)["status"] == "complete":
                    continue
                if current != p.config_id:
                    stop_current()
                    current = None
                    try:
                        server_entry = self._launch_server(p.server)
                    except (ServerError, ray.exceptions.RayTaskError) as e:
                        msg = str(e.cause if isinstance(e, ray.exceptions.RayTaskError) and e.cause else e)
                        first = msg.strip().splitlines()[0] if msg.strip() else type(e).__name__
                        self.manifest["server_configs"][p.config_id].update(status="failed", error=msg[-2000:])
                        self._entry(p.point).update(status="failed", error=f"server did not start: {first}")
                        self._fetch_log(p.config_id)
                        self._stop_server()
                        self.save()
                        if self.spec.fail_fast:
                            raise RunError(f"server {p.config_id} failed to start: {first}")
                        continue
                    current = p.config_id
                try:
                    self._run_point(p, server_entry)
                except (RunError, KeyboardInterrupt):
                    raise
                except Exception as e:  # a bug or an unexpected fault: fail this point, keep the run
                    self._internal_error(p.point, e)
                entry = self._entry(p.point)
                if entry["status"] == "failed" and self.spec.fail_fast:
                    raise RunError(f"point {p.point} failed: {entry.get('error')}")
                if "server_died" in entry["flags"]:  # the next point relaunches it
                    stop_current()
                    current = None
        finally:
            stop_current()

    def _fetch_log(self, config_id: str) -> None:
        """Stop the engine, then copy its whole log next to the results when the server node spooled it, and
        clear that spool (the actor itself is killed by _stop_server)."""
        if self.server is None:
            return
        with contextlib.suppress(Exception):
            ray.get(self.server.stop.remote(self._engine_grace()), timeout=60)  # the log is complete (and scrubbed) once stopped
        if not self._server_spooled or not engine_for(self.spec.server.engine).launches_process:
            return
        dest = server_log_path(self.run_dir, config_id)
        with contextlib.suppress(Exception):
            text = ray.get(self.server.read_log.remote(), timeout=30)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
            ray.get(self.server.discard_spool.remote(), timeout=30)

    def _teardown(self) -> None:
        if self.stop_requested.is_set():
            self.progress.status("stopping: engine and generators")
        self._stop_server()
        for g in self.generators:
            try:
                ray.get(g.close.remote(), timeout=5)
            except Exception:
                pass
            try:
                ray.kill(g)
            except Exception:
                pass
        self.generators = []
        try:
            cluster.release(self.placement)
        except Exception:
            pass
        if self._started_ray and ray.is_initialized():
            ray.shutdown()


def corpus_mismatch(seen: dict[str, dict[str, Any]]) -> str | None:
    """One line naming the first host whose code corpus differs from the driver's (same files, same bytes), or None.
    Where a tree lives may differ between hosts; what it holds may not."""
    here = seen["driver"]
    for who, fp in seen.items():
        for wl, mine in here.items():
            theirs = fp.get(wl) or {}
            if fp.get("error") or theirs.get("sha256") != mine["sha256"]:
                got = fp.get("error") or f"{theirs.get('root')} ({theirs.get('files')} files, sha256 {theirs.get('sha256')})"
                return (f"{who} would build different {wl} prompts for one seed: its code corpus is {got}, the "
                        f"driver's {mine['root']} ({mine['files']} files, sha256 {mine['sha256']}); pin one tree "
                        f"present on every host with --workload-opt code_dir=PATH")
    return None


def _first_line(e: BaseException) -> str:
    cause = getattr(e, "cause", None) or e
    return ((str(cause).strip().splitlines() or [type(cause).__name__])[0])[:200]


def _part_files(run_dir: Path, point: str) -> list[Path]:
    root = Path(run_dir) / REQUESTS_DIR / f"point={point}"
    return sorted(root.rglob("part-*.parquet")) if root.exists() else []


def count_rows_on_disk(run_dir: Path, point: str) -> int:
    """Rows in a point's readable part files (a file cut short has no footer and counts as none)."""
    n = 0
    for f in _part_files(run_dir, point):
        with contextlib.suppress(OSError, pa.ArrowException):
            n += pq.read_metadata(f).num_rows
    return n


def rows_by_status(run_dir: Path, point: str) -> dict[str, int]:
    """ok/failed/cancelled counts of a point's readable part files."""
    statuses: list[str] = []
    for f in _part_files(run_dir, point):
        with contextlib.suppress(OSError, pa.ArrowException):
            statuses += pq.ParquetFile(f).read(columns=["status"]).column("status").to_pylist()
    return {k: statuses.count(k) for k in ("ok", "failed", "cancelled")}


def _shorten(session: Session) -> Session:
    """Warm-up sessions: first turn only, at most 32 output tokens."""
    from dataclasses import replace

    turn = replace(session.turns[0], max_tokens=min(32, session.turns[0].max_tokens), think_time_s=0.0)
    return replace(session, turns=(turn,))


def _write_bytes(dest: Path, data: bytes) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, dest)


def install_signal_handlers(runner: Runner) -> None:
    """SIGINT/SIGTERM stop the run cleanly: generators record in-flight requests as cancelled, then teardown."""

    def handler(signum: int, frame: Any) -> None:
        if runner.stop_requested.is_set():
            if runner._finalizing:
                return  # the run is writing its final manifest: let it finish
            raise KeyboardInterrupt  # second signal: stop waiting
        runner.request_stop(f"stopped by {signal.Signals(signum).name}")

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
