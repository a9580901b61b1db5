"""The ServerActor: launches the engine on its node, waits until healthy, records what it is, scrapes /metrics,
and tears it down. Started with a plain Popen (no new session): Ray kills the actor's process group if it dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import ray

from rig.contracts.dialect import probe_paths
from rig.contracts.live import ServerGauges
from rig.contracts.server import (
    FlushAnswer,
    GpuSamplerStats,
    GpuTelemetry,
    ServerDescription,
    ServerReady,
    ServerStarted,
    WaitProgress,
)
from rig.results import (
    GPU_METRICS_SCHEMA,
    SERVER_METRICS_SCHEMA,
    PartWriter,
    atomic_write,
    gpu_metrics_dir,
    server_metrics_dir,
)
from rig.server import env_refs
from rig.server.engines import engine_for
from rig.server.gpu_telemetry import (
    SOURCE_SIMULATED,
    GpuSampler,
    Source,
    TelemetryAbsent,
    assigned_devices,
    open_source,
)
from rig.server.log_sink import LogSink
from rig.server.ports import ServerError, free_port
from rig.server.redaction import MIN_SECRET_CHARS, mask_argv, redact, scrub_info, secret_values
from rig.server.scrape import LastGauges, parse_metrics, summed_values
from rig.server.spec import ServerConfig

FLUSH_TIMEOUT_S = 60.0  # what SGLang's bench_serving passes (benchmark/serving.py)
# Asked when the health path answers 404: most OpenAI-compatible services, proxies and gateways have no /health,
# and every one lists its models (OpenAI's API reference: GET /v1/models).
READY_FALLBACK = "/v1/models"


class ServerActor:
    def __init__(
        self,
        cfg: ServerConfig,
        spool_root: str,
        log_rel: str,
        api_key: str | None = None,
        env_values: dict[str, str] | None = None,
    ):
        """``spool_root``: where this node writes the log and metrics parts (the run directory when the driver's
        filesystem is shared, else a local spool; {host}, {node_ip}, {node_id} are filled in here). The driver
        copies what it cannot see through Ray (``read_file``, ``read_log``). ``env_values``: the value of each
        ``${NAME}`` in the configuration, read by the driver; put into the launch only, masked everywhere else."""
        self.cfg = cfg
        self.engine = engine_for(cfg.engine)
        self.api_key = api_key
        self.env_values = dict(env_values or {})
        self.node_id: str | None  # None outside Ray
        try:
            if not ray.is_initialized():  # outside Ray (tests): asking Ray would start a local instance
                raise RuntimeError("not in Ray")
            self.node_ip = ray.util.get_node_ip_address()
            self.node_id = ray.get_runtime_context().get_node_id()
            self.gpu_ids = [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]
        except Exception:  # outside Ray (tests)
            self.node_ip, self.node_id, self.gpu_ids = "127.0.0.1", None, []
        self.spool_root = Path(
            spool_root.format(host=socket.gethostname(), node_ip=self.node_ip, node_id=self.node_id or "local")
        )
        self.log_path = self.spool_root / log_rel
        self.proc: subprocess.Popen | None = None
        self.url: str | None = cfg.url.rstrip("/") if cfg.url else None
        self.argv: list[str] = []
        self._scrape_task: asyncio.Task | None = None
        self._scrape_writer: PartWriter | None = None
        self._scrape_lost: str | None = None  # the last point's server-metrics rows that could not be written
        self._http: aiohttp.ClientSession | None = None
        self._gpu_source: Source | None = None  # open_telemetry: NVML, the simulator's model, or none
        self._gpu_sampler: GpuSampler | None = None
        self._gpu_stats: GpuSamplerStats | None = None  # the last point's sampler figures
        self._wait = WaitProgress()  # what a wait_ready in progress has seen
        self._sink: LogSink | None = None  # the engine's output into its capped log
        self._gauges = LastGauges()  # the last scrape's gauges, for the live view

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> ServerStarted:
        """Launch the engine process (nothing for 'external'); returns its command and URL."""
        if not self.engine.launches_process:
            return ServerStarted(command=[], url=self.url, node_ip=self.node_ip, node_id=self.node_id)
        bind = self.cfg.host or "0.0.0.0"
        port = free_port(self.cfg.port, bind)
        try:
            launched = env_refs.expand(self.cfg, self.env_values)  # ${NAME} filled here, and only here
            self.argv = self.engine.launch_argv(launched, bind, port, self.api_key)
        except ValueError as e:  # a command template that cannot be filled (checked before the run; here for safety)
            raise ServerError(f"{self.cfg.engine}: {e}") from None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.engine.env(launched)}
        if self.api_key:
            self.argv = [*self.argv, "--api-key", self.api_key] if self.cfg.engine in ("sglang", "sim") else self.argv
            env["VLLM_API_KEY"] = self.api_key
        # Plain Popen: no start_new_session, so Ray's process-group cleanup sweeps the engine's whole tree. Its
        # output goes through a pipe into a capped log (head and rotating tail: rig/server/log_sink.py).
        self._sink = LogSink(self.log_path)
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        self._sink.start(self.proc.stdout)  # type: ignore[arg-type]  # a pipe: never None here
        url_host = self.node_ip if bind in ("0.0.0.0", "::") else bind
        self.url = f"http://{url_host}:{port}"
        return ServerStarted(
            command=self.public_command(),
            url=self.url,
            node_ip=self.node_ip,
            node_id=self.node_id,
            gpu_ids=self.gpu_ids,
            pid=self.proc.pid,
        )

    @property
    def secrets(self) -> list[str]:
        """What must never be written out: the API key, every ``${NAME}`` value, and the value of any secret flag of
        the command."""
        argv = self.argv or list(self.cfg.extra_args)
        refs = [v for v in self.env_values.values() if len(v) >= MIN_SECRET_CHARS]
        return [x for x in (self.api_key, *refs, *secret_values(argv)) if x]

    def public_command(self) -> list[str]:
        """The command with any secret masked (the API key is passed on the command line to SGLang, and wherever a
        command template puts {api_key})."""
        return [redact(a, self.secrets) for a in mask_argv(self.argv)]

    def _base_url(self) -> str:
        """The server's URL: given for a server rig did not launch, else known once start() has run."""
        if self.url is None:
            raise RuntimeError(f"{self.cfg.engine}: the server has no URL yet (start() sets it)")
        return self.url

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self._http

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_tail(self, lines: int = 15) -> str:
        if self._sink is not None and self.proc is not None and self.proc.poll() is not None:
            self._sink.join(2.0)  # the engine exited: what it wrote last may still be in the pipe
        return "\n".join(self._log_text().rstrip().splitlines()[-lines:])

    async def _probe_ready(self, path: str) -> int:
        """The HTTP status of GET ``path`` (connection errors propagate)."""
        async with self._session().get(
            self._base_url() + path, headers=self._headers(), timeout=aiohttp.ClientTimeout(total=2)
        ) as r:
            return r.status

    async def wait_ready(self, timeout_s: float | None = None) -> ServerReady:
        """Poll the health endpoint -- and, where it answers 404, /v1/models -- until one answers 200; fail at once
        if the process exits, and for a server rig did not launch, once nothing has answered for
        ``unreachable_timeout_s``. Returns startup facts: ``ready_after_s`` and ``probe``, the path that answered."""
        timeout_s = timeout_s or self.cfg.health_timeout_s
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        self._wait = WaitProgress(elapsed_s=0.0, last="no answer yet")
        silent_since: float | None = None  # external server: since when nothing has answered
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerError(
                    f"{self.cfg.engine} exited with code {self.proc.returncode} before it was healthy"
                    f"\n{self.log_tail()}"
                )
            answered = True
            probe = self.engine.health_path()
            try:
                status = await self._probe_ready(probe)
                if status == 404:  # no health route: a server that lists its models is up
                    last = f"HTTP 404 from {probe}"
                    probe = READY_FALLBACK
                    status = await self._probe_ready(probe)
                if status == 200:
                    await asyncio.sleep(0.2)
                    if self.proc is not None and self.proc.poll() is not None:
                        # Something else answered on our port and our engine died (e.g. address in use).
                        raise ServerError(
                            f"{self.cfg.engine} exited with code {self.proc.returncode} while "
                            f"another process answered on {self.url}\n{self.log_tail()}"
                        )
                    return ServerReady(ready_after_s=time.monotonic() - t0, probe=probe)
                last = (
                    f"{last}, HTTP {status} from {probe}" if probe == READY_FALLBACK else f"HTTP {status} from {probe}"
                )
                # 404 at /health: not the server's root URL, unless /v1/models answers; a 4xx there (no route, a
                # refused key) will not change by waiting: the unreachable budget applies and its message says it
                answered = status >= 500 if probe == READY_FALLBACK else status != 404
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                last, answered = _why(e), False
            now = time.monotonic()
            self._wait = WaitProgress(elapsed_s=now - t0, last=last)
            if answered or self.engine.launches_process:
                silent_since = None  # a launched engine refuses connections while it loads: that is its budget
            else:
                silent_since = silent_since or now
                if now - silent_since >= self.cfg.unreachable_timeout_s:
                    raise ServerError(
                        f"nothing usable answers at {self.url} after {now - t0:.0f}s (last: {last}); "
                        f"is the server running there? (--unreachable-timeout waits longer)"
                    )
            await asyncio.sleep(0.25 if now - t0 < 10 else 1.0)
        raise ServerError(
            f"{self.cfg.engine} not healthy at {self.url} after {timeout_s:g}s (last: "
            f"{self._wait.last})\n{self.log_tail()}"
        )

    async def wait_progress(self) -> WaitProgress:
        """Elapsed seconds and the last health answer (or connection error) of a wait_ready in progress."""
        return self._wait.model_copy()

    async def describe(self) -> ServerDescription:
        """Server info endpoints' JSON and the parsed startup log (recorded per server configuration)."""
        info: dict[str, Any] = {}
        # A server of no engine rig models is also asked the paths that identify SGLang and vLLM
        # (rig.loadgen.dialects.identify decides from the answers).
        paths = list(dict.fromkeys([*self.engine.info_paths(), *probe_paths(self.cfg.engine, self.cfg.dialect)]))
        for path in paths:
            try:
                async with self._session().get(
                    self._base_url() + path, headers=self._headers(), timeout=aiohttp.ClientTimeout(total=10)
                ) as r:
                    info[path] = await r.json(content_type=None) if r.status == 200 else {"http_status": r.status}
            except (TimeoutError, aiohttp.ClientError, ValueError) as e:
                info[path] = {"error": f"{type(e).__name__}: {e}"}
        startup = self.engine.parse_startup_log(self._log_text())
        # /server_info echoes every resolved server arg, secrets included: never let them reach the manifest.
        return ServerDescription(
            info=redact({k: scrub_info(v) for k, v in info.items()}, self.secrets), startup=startup
        )

    def _log_text(self) -> str:
        if self._sink is not None:
            return redact(self._sink.text(), self.secrets)
        try:
            return redact(self.log_path.read_text(errors="replace"), self.secrets)
        except OSError:
            return ""

    def _scrub_log(self) -> None:
        """Fold the capped log into one file, and mask the secrets in it: engines print their arguments (SGLang logs
        ServerArgs with api_key)."""
        with contextlib.suppress(OSError):
            text = (self._sink.close() if self._sink is not None else self.log_path.read_bytes()).decode(
                errors="replace"
            )
            scrubbed = redact(text, self.secrets)
            if scrubbed != text:
                atomic_write(self.log_path, scrubbed)

    async def read_log(self) -> str:
        return self._log_text()

    async def flush_cache(self, timeout_s: float = FLUSH_TIMEOUT_S) -> FlushAnswer:
        """POST /flush_cache?timeout=T (SGLang/sim): clears the prefix cache and resets the spec counters. Without
        a timeout SGLang answers 400 while any request is still pending (entrypoints/http_server.py,
        scheduler_components/flush_wrapper.py); with one it waits up to T s for idle, as bench_serving does."""
        if self.cfg.engine not in ("sglang", "sim"):
            return FlushAnswer(status=None, body="not supported by this engine")
        try:
            async with self._session().post(
                self._base_url() + f"/flush_cache?timeout={timeout_s:g}",
                headers=self._headers(),
                timeout=aiohttp.ClientTimeout(total=timeout_s + 30),
            ) as r:
                return FlushAnswer(status=r.status, body=(await r.text())[:200])
        except (TimeoutError, aiohttp.ClientError) as e:
            return FlushAnswer(status=None, body=f"{type(e).__name__}: {e}")

    async def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None

    async def wait_exit(self) -> int | None:
        """Resolves when the engine process exits (the driver watches this to detect a dead server)."""
        proc = self.proc
        if proc is None:  # nothing of ours to watch: never resolves (the driver cancels it)
            await asyncio.Event().wait()
            return None
        while proc.poll() is None:
            await asyncio.sleep(0.5)
        return proc.returncode

    async def clock(self) -> float:
        """This node's wall clock (the driver measures its offset, to put gpu_metrics times on its own clock)."""
        return time.time()

    # ------------------------------------------------------------------ GPU telemetry
    async def open_telemetry(self) -> GpuTelemetry:
        """Open the GPU telemetry source once the engine is healthy (the simulator answers /sim/gpu then): NVML on
        the GPUs Ray gave this actor, or the simulator's power model for ``sim``. Returns the manifest's
        GpuTelemetry fields: the source and its GPUs, or why there is none."""
        if self._gpu_source is not None:
            self._gpu_source.close()
            self._gpu_source = None
        devices = assigned_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), self.gpu_ids)
        try:
            # NVML's init and the simulator's first answer block: off the actor's event loop.
            src = await asyncio.to_thread(open_source, self.cfg.engine, self.url, devices, self._headers())
        except TelemetryAbsent as e:
            return GpuTelemetry(source=None, absent_reason=str(e), node_ip=self.node_ip)
        self._gpu_source = src
        note = (
            (
                "simulated: the simulator's power model (rig/sim/power.py; parameters and their sources in the sim "
                "profile), not a measurement"
            )
            if src.source == SOURCE_SIMULATED
            else None
        )
        return GpuTelemetry(source=src.source, gpus=src.gpus, node_ip=self.node_ip, note=note)

    async def gpu_sample_at(self, wall_ts: float) -> None:
        """An extra GPU sample at ``wall_ts`` on this node's clock (the point's common start)."""
        if self._gpu_sampler is not None:
            self._gpu_sampler.sample_at(wall_ts)

    async def gpu_stats(self) -> GpuSamplerStats | None:
        """The GPU sampler's figures over the last point (samples, failed rounds, CPU time), None without one."""
        return self._gpu_stats

    # ------------------------------------------------------------------ metrics
    async def _scrape(self) -> list[tuple[str, str, float]] | None:
        try:
            async with self._session().get(
                self._base_url() + "/metrics", headers=self._headers(), timeout=aiohttp.ClientTimeout(total=5)
            ) as r:
                if r.status != 200:
                    return None
                return parse_metrics(await r.text())
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None

    async def metrics_snapshot(self) -> dict[str, float]:
        """Every metric summed over its labels (for counter deltas over a point's window)."""
        samples = await self._scrape()
        return summed_values(samples or [])

    async def start_scrape(self, run_id: str, point: str, interval_s: float) -> None:
        await self.stop_scrape()
        self._scrape_writer = PartWriter(
            server_metrics_dir(self.spool_root, point), SERVER_METRICS_SCHEMA, max_age_s=5.0
        )
        writer = self._scrape_writer

        async def loop() -> None:
            next_t = time.monotonic()
            while True:
                ts = time.time()
                samples = await self._scrape() or []
                self._gauges.seen(samples)
                for name, labels, value in samples:
                    writer.add(
                        {"run_id": run_id, "point": point, "ts": ts, "name": name, "labels": labels, "value": value}
                    )
                await asyncio.to_thread(writer.maybe_flush)
                next_t += interval_s
                await asyncio.sleep(max(0.0, next_t - time.monotonic()))

        self._scrape_task = asyncio.get_running_loop().create_task(loop())
        if self._gpu_source is not None:  # its own thread: NVML calls block, and nothing waits on them
            gpu_writer = PartWriter(gpu_metrics_dir(self.spool_root, point), GPU_METRICS_SCHEMA, max_age_s=5.0)
            self._gpu_sampler = GpuSampler(
                self._gpu_source, gpu_writer, {"run_id": run_id, "point": point, "node": self.node_ip}, interval_s
            )
            self._gpu_stats = None
            self._gpu_sampler.start()

    async def live(self) -> ServerGauges:
        """The last scrape's gauges and the GPUs' last power reading, for the driver's live view (nothing is
        scraped for it)."""
        return self._gauges.answer(self._gpu_sampler.latest_power_w if self._gpu_sampler is not None else None)

    async def stop_scrape(self) -> list[str]:
        if self._scrape_task is not None:
            self._scrape_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scrape_task
            self._scrape_task = None
        parts: list[str] = []
        if self._scrape_writer is not None:
            writer = self._scrape_writer
            self._scrape_lost = None
            try:
                await asyncio.to_thread(writer.close)  # a transient disk error is retried there (PartWriter)
            except OSError as e:  # still failing: what was written stays, what was not is counted
                self._scrape_lost = f"{writer.pending} server-metrics rows not written ({e.strerror or e})"
            parts = [str((writer.directory / p).relative_to(self.spool_root)) for p in writer.parts]
            self._scrape_writer = None
        if self._gpu_sampler is not None:
            sampler, self._gpu_sampler = self._gpu_sampler, None
            stats = await asyncio.to_thread(sampler.stop)
            self._gpu_stats = stats.report(sampler.source.source)
            parts += [str((sampler.writer.directory / p).relative_to(self.spool_root)) for p in sampler.writer.parts]
        return parts

    async def scrape_lost(self) -> str | None:
        """Why some of the last point's server-metrics rows are not on disk (None: all of them are)."""
        return self._scrape_lost

    async def read_file(self, rel_path: str) -> bytes:
        return (self.spool_root / rel_path).read_bytes()

    async def discard_spool(self) -> None:
        """Remove this server's local spool once the driver holds copies (only called for a spool root)."""
        shutil.rmtree(self.spool_root, ignore_errors=True)

    # ------------------------------------------------------------------ teardown
    async def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM the engine (it tears down its own children), then SIGKILL whatever of its tree remains."""
        await self.stop_scrape()
        if self._gpu_source is not None:
            self._gpu_source.close()
            self._gpu_source = None
        if self._http is not None:
            await self._http.close()
        if self.proc is None:
            return None
        try:
            tree = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            while self.proc.poll() is None and time.monotonic() - t0 < grace_s:
                await asyncio.sleep(0.1)
        for p in [*tree, psutil.Process(self.proc.pid) if self.proc.poll() is None else None]:
            if p is not None:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self._scrub_log()
        return self.proc.returncode


def _why(e: BaseException) -> str:
    """A connection error in a few words: 'connection refused', 'timed out', 'name not known'."""
    if isinstance(e, asyncio.TimeoutError):
        return "no answer within 2s"
    os_err = getattr(e, "os_error", None)
    if isinstance(os_err, ssl.SSLError):  # its errno is OpenSSL's code (1 read as 'operation not permitted')
        reason = os_err.reason or type(os_err).__name__
        hint = "; is it a plain http server? use http://" if "WRONG_VERSION" in str(reason).upper() else ""
        return f"TLS handshake failed ({reason}){hint}"
    if isinstance(os_err, OSError) and os_err.errno:
        return os.strerror(os_err.errno).lower()
    return f"{type(e).__name__}: {e}"[:120]


def remote_class(**options: Any) -> Any:  # a Ray actor class (Ray ships no types)
    """Never restarted: a restarted server would silently change the system under test."""
    return ray.remote(max_restarts=0, max_task_retries=0, **options)(ServerActor)
