"""One server configuration's engine: launch it, wait until healthy, record what it really runs, fetch its log, stop."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import ray

from rig.contracts import (
    GpuTelemetry,
    ServerConfigEntry,
    ServerDescription,
    ServerReady,
    ServerStarted,
    WaitProgress,
)
from rig.loadgen.dialects import Dialect, limits, resolve
from rig.placement import measure_clock_offset
from rig.results import server_log_path
from rig.run.capacity_note import queue_note
from rig.run.context import RunContext
from rig.server import env_refs
from rig.server.actor import remote_class as server_class
from rig.server.adaptive import adaptive_table
from rig.server.effective import change_lines, effective_config
from rig.server.engines import engine_for
from rig.server.spec import ServerConfig


def served_model(cfg: ServerConfig, entry: ServerConfigEntry) -> str:
    """The model name requests must carry: the configured one, else what /v1/models reported, else the path."""
    if cfg.served_model_name:
        return cfg.served_model_name
    models = (entry.info or {}).get("/v1/models") or {}
    try:
        return models["data"][0]["id"]
    except (KeyError, IndexError, TypeError):
        return cfg.model


def entry_dialect(entry: ServerConfigEntry) -> Dialect:
    """The dialect launch() decided for a configuration, as its manifest entry records it."""
    if entry.dialect is None:
        raise RuntimeError("server configuration without a dialect (launch() decides it before any point runs)")
    return Dialect(entry.dialect, dict(entry.extra_body or {}), entry.dialect_source or "engine")


class ServerLifecycle:
    """The server actor of the configuration being measured (at most one at a time)."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.handle: Any = None  # the server actor
        self.spooled = False  # the server node writes to a local spool the driver copies from

    def launch(self, cfg: ServerConfig) -> ServerConfigEntry:
        """Start the engine of ``cfg`` and wait until it is healthy; return its manifest entry."""
        cfg, started = self._start(cfg)
        ready = self._wait_ready(cfg, started)
        cid = cfg.config_id()
        desc = ServerDescription.model_validate(ray.get(self.handle.describe.remote()))
        info = desc.info
        # Which fields its requests may carry: the user's --dialect, the engine's, or what the probes found.
        dialect = resolve(cfg.engine, cfg.dialect, cfg.extra_body, info)
        self.ctx.store.update_server_config(
            cid,
            status="ready",
            ready_after_s=ready.ready_after_s,
            ready_probe=ready.probe,
            startup=desc.startup,
            server_info=info.get("/server_info"),
            model_info=info.get("/model_info"),
            info=info,
            **dialect.manifest(),
        )
        if dialect.source != "engine" or dialect.extra_body:  # what a user of a foreign server wants to see
            extra = f", extra body fields {', '.join(dialect.extra_body)}" if dialect.extra_body else ""
            self.ctx.progress.status(
                f"{cfg.engine} ready at {ready.probe}; requests speak the "
                f"{dialect.name} dialect ({dialect.source}){extra}"
            )
        # What the server really runs (it may change requested values) and whether it honours per-request seeds.
        effective = effective_config(cfg, info.get("/server_info"), desc.startup, dialect.name == "sglang")
        warnings = change_lines(cid, effective)
        # An adaptive server switches steps itself: its points are labelled with the table, not fixed steps.
        adaptive, adaptive_warnings = adaptive_table(cfg, info.get("/server_info"))
        warnings += adaptive_warnings
        asked = [(w.name, dict(w.sampling())) for w in self.ctx.spec.workloads]
        warnings += [f"server {cid}: {w}" for w in limits(dialect, asked)]  # what the dialect cannot send
        load = self.ctx.spec.load
        # the levels the points run (under a load profile its peak, not the unused default --concurrency list)
        levels = [c for c, _ in load.levels() if c is not None]
        queued = queue_note(cid, effective, info.get("/server_info"), levels, load.mode)
        warnings += [queued] if queued else []  # said before the points run: levels above what runs at once
        self.ctx.store.update_server_config(cid, effective=effective, warnings=warnings, adaptive=adaptive)
        for w in warnings:
            self.ctx.progress.status(f"warning: {w}")
        self.ctx.store.update_server_config(cid, telemetry=self.open_telemetry())
        self.ctx.store.save()
        return self.ctx.store.server_config(cid)

    def _start(self, cfg: ServerConfig) -> tuple[ServerConfig, ServerStarted]:
        """Create the server actor where the placement says and start the engine; returns the configuration as
        launched (on one machine it listens on loopback) and what the actor reported."""
        Server = server_class()
        log_rel = str(server_log_path(Path("."), cfg.config_id()))
        c = self.ctx.spec.cluster
        placement = self.ctx.fleet.placement
        if placement is None:
            raise RuntimeError("server launch before the fleet is placed (Fleet.setup runs first)")
        # The server node writes where it can: the run directory on one machine or a shared filesystem, else a
        # local spool; the driver fetches the log and metrics parts through Ray (fetch_log, execute's gather).
        self.spooled = not (placement.local or c.shared_results)
        root = (
            f"{c.spool_dir.rstrip('/')}/{self.ctx.spec.run_id}/server"
            if self.spooled
            else str(self.ctx.run_dir.resolve())
        )
        if placement.local and cfg.host is None:
            # The embedded default is one machine: the engine listens on loopback only (not the LAN), and the
            # generators reach it there. Multi-host placement binds the node's address as before.
            cfg = cfg.model_copy(update={"host": "127.0.0.1"})
        wanted = set(env_refs.names([cfg]))
        env = {n: v for n, v in self.ctx.server_env.items() if n in wanted}  # this launch's values alone
        self.handle = Server.options(**placement.server_options).remote(cfg, root, log_rel, self.ctx.api_key, env)
        cid = cfg.config_id()
        self.ctx.store.set_server_config(
            cid, ServerConfigEntry(engine=cfg.engine, knobs=cfg.knobs(), status="starting")
        )
        started = ServerStarted.model_validate(ray.get(self.handle.start.remote()))
        self.ctx.store.update_server_config(
            cid, command=started.command, url=started.url, node_ip=started.node_ip, gpu_ids=started.gpu_ids
        )
        self.ctx.store.save()
        return cfg, started

    def _wait_ready(self, cfg: ServerConfig, started: ServerStarted) -> ServerReady:
        """Wait until the engine answers healthy, saying every 10 s what the wait sees (a model load takes
        minutes); a stop request ends the wait (KeyboardInterrupt), an engine that died raises its ServerError
        (wrapped by Ray)."""
        self.ctx.progress.status(f"waiting for {cfg.engine} (steps={cfg.steps}) to be healthy at {started.url}")
        ready_ref = self.handle.wait_ready.remote()
        next_note = time.monotonic() + 10
        while True:
            done, _ = ray.wait([ready_ref], timeout=0.5)
            if done:
                break
            if self.ctx.stop.is_set():
                raise KeyboardInterrupt
            if time.monotonic() >= next_note:
                next_note += 10
                with contextlib.suppress(Exception):
                    seen = WaitProgress.model_validate(ray.get(self.handle.wait_progress.remote(), timeout=2))
                    self.ctx.progress.status(
                        f"still waiting for {cfg.engine} at {started.url}: {seen.elapsed_s:.0f}s, last: {seen.last}"
                    )
        return ServerReady.model_validate(ray.get(ready_ref))

    def open_telemetry(self) -> GpuTelemetry:
        """The server node's GPU telemetry (NVML, or the simulator's model) or why there is none, with the node's
        clock offset so its samples line up with the points' windows."""
        got = GpuTelemetry.model_validate(ray.get(self.handle.open_telemetry.remote()))
        if got.source is None:
            self.ctx.progress.status(f"GPU telemetry absent: {got.absent_reason}")
            return got
        if got.source == "simulated":
            self.ctx.progress.status(f"GPU telemetry: SIMULATED ({len(got.gpus)} GPUs of the simulator's power model)")
        try:
            offset, _ = measure_clock_offset(self.handle)
        except Exception:  # the samples still count; their times are then taken as the driver's
            offset = None
        return got.model_copy(update={"clock_offset_s": offset})

    def grace(self) -> float:
        """Seconds the engine gets to exit on SIGTERM: less when the user asked the run to stop."""
        return 5.0 if self.ctx.stop.is_set() else 30.0

    def fetch_log(self, config_id: str) -> None:
        """Stop the engine, then copy its whole log next to the results when the server node spooled it, and
        clear that spool (the actor itself is killed by stop_server)."""
        if self.handle is None:
            return
        with contextlib.suppress(Exception):  # the log is complete (and scrubbed) once the engine has stopped
            ray.get(self.handle.stop.remote(self.grace()), timeout=60)
        if not self.spooled or not engine_for(self.ctx.spec.server.engine).launches_process:
            return
        dest = server_log_path(self.ctx.run_dir, config_id)
        with contextlib.suppress(Exception):
            text = ray.get(self.handle.read_log.remote(), timeout=30)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
            ray.get(self.handle.discard_spool.remote(), timeout=30)

    def stop_server(self) -> None:
        """Stop the engine and kill the server actor (no-op when none is up)."""
        if self.handle is None:
            return
        with contextlib.suppress(Exception):  # already dead
            ray.get(self.handle.stop.remote(self.grace()), timeout=60)
        with contextlib.suppress(Exception):
            ray.kill(self.handle)
        self.handle = None
