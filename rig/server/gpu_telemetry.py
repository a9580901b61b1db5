"""GPU telemetry of the server node: NVML samples (or the simulator's modelled ones) into ``gpu_metrics`` Parquet.

Sources answer ``sample()`` with one row per GPU in NVML's units (power mW, energy counter mJ, utilisation %,
memory bytes, SM clock MHz, temperature C, throttle-reason bitmask):

- ``NvmlSource``: the GPUs Ray gave the server actor, through ``pynvml`` (nvidia-ml-py, imported only here and only
  when opened). Calls are nvidia-ml-py's own (pynvml.py): nvmlInit, nvmlDeviceGetHandleByIndex / ByUUID,
  nvmlDeviceGetPowerUsage, nvmlDeviceGetTotalEnergyConsumption, nvmlDeviceGetUtilizationRates,
  nvmlDeviceGetMemoryInfo, nvmlDeviceGetClockInfo(NVML_CLOCK_SM), nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU),
  nvmlDeviceGetCurrentClocksEventReasons (ThrottleReasons before 12.535), nvmlDeviceGetEnforcedPowerLimit.
  A field a GPU does not support (NVMLError_NotSupported) is null, with the error named in the row's ``errors``.
- ``SimulatedSource``: the simulator's ``GET /sim/gpu`` (rig/sim/power.py); every row says ``source=simulated``.

Where there is neither (no pynvml, no driver library, no GPU assigned) ``open_source`` returns no source and the
reason, which the manifest records; nothing is invented. ``GpuSampler`` samples on its own thread at the metrics
interval: NVML calls block, and nothing of it runs on the engine's or the generators' request path.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol, TypedDict

from pydantic import BaseModel

from rig.contracts.server import GpuSamplerStats
from rig.results import PartWriter

log = logging.getLogger("rig.server.gpu")

SOURCE_NVML = "nvml"
SOURCE_SIMULATED = "simulated"
SIM_PATH = "/sim/gpu"


class GpuSample(TypedDict):
    """One GPU in one sampling round, in NVML's units (a field the GPU does not report is None, the reason in
    ``errors``); the sampler adds the row's keys (run, point, node, ts, source, sample_s)."""

    gpu_index: int
    gpu_uuid: str
    gpu_name: str
    power_limit_mw: int | None
    power_mw: int | None
    energy_mj: int | None
    util_gpu_pct: int | None
    util_mem_pct: int | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    sm_clock_mhz: int | None
    temperature_c: int | None
    throttle_reasons: int | None
    errors: str | None


class TelemetryAbsent(Exception):
    """No telemetry on this node; the message is why (recorded in the manifest)."""


class Source(Protocol):
    source: str
    gpus: list[dict[str, Any]]

    def sample(self) -> list[GpuSample]: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------------------------------------------------- NVML
def assigned_devices(visible: str | None, ray_ids: list[str]) -> list[str]:
    """The devices the actor may use, as CUDA names them: CUDA_VISIBLE_DEVICES when set (Ray sets it to the GPUs it
    gave the actor), else Ray's accelerator ids. Entries are indices ("0") or UUIDs ("GPU-…", "MIG-…"). A UUID maps
    to its GPU exactly; an index is taken as NVML's, which is CUDA's order on a node of identical GPUs or with
    CUDA_DEVICE_ORDER=PCI_BUS_ID (NVML enumerates by PCI bus id): the manifest records each device's NVML index and
    UUID, so the mapping can be checked."""
    if visible is not None:
        entries = [v.strip() for v in visible.split(",") if v.strip()]
        # CUDA stops at the first invalid entry; "-1" or "" hides every device.
        out: list[str] = []
        for v in entries:
            if v.lstrip("-").isdigit() and int(v) < 0:
                break
            out.append(v)
        return out
    return [str(g) for g in ray_ids]


def _nvml_error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def import_nvml() -> ModuleType:
    """pynvml (nvidia-ml-py), imported only where telemetry is opened; TelemetryAbsent where it is missing."""
    try:
        import pynvml
    except ImportError as e:
        raise TelemetryAbsent(f"pynvml (nvidia-ml-py) is not importable on the server node: {e}") from None
    return pynvml


class NvmlSource:
    """The assigned GPUs through NVML. ``open`` raises TelemetryAbsent with the reason where NVML is unusable."""

    source = SOURCE_NVML

    def __init__(self, nvml: ModuleType, handles: list[Any], gpus: list[dict[str, Any]]):
        self.nvml = nvml
        self.handles = handles
        self.gpus = gpus
        # The clock-event call was renamed in NVML 12.535 (ThrottleReasons is deprecated); use what this one has.
        self._reasons: Callable[[Any], int] | None = getattr(
            nvml, "nvmlDeviceGetCurrentClocksEventReasons", None
        ) or getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)

    @classmethod
    def open(cls, devices: list[str], nvml: ModuleType | None = None) -> NvmlSource:
        if not devices:
            raise TelemetryAbsent(
                "no GPU assigned to the server actor (CUDA_VISIBLE_DEVICES and Ray's GPU ids are empty)"
            )
        if nvml is None:
            nvml = import_nvml()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:  # NVMLError_LibraryNotFound (no driver), DriverNotLoaded, ...
            raise TelemetryAbsent(f"NVML unavailable: {_nvml_error(e)}") from None
        handles, gpus = [], []
        try:
            for dev in devices:
                if dev.startswith("MIG-"):
                    raise TelemetryAbsent(
                        f"device {dev} is a MIG instance: NVML reports power and energy per "
                        "physical GPU, not per instance"
                    )
                h = (
                    nvml.nvmlDeviceGetHandleByUUID(dev)
                    if dev.startswith("GPU-")
                    else nvml.nvmlDeviceGetHandleByIndex(int(dev))
                )
                info = {
                    "cuda_device": dev,
                    "index": int(nvml.nvmlDeviceGetIndex(h)),
                    "uuid": _text(nvml.nvmlDeviceGetUUID(h)),
                    "name": _text(nvml.nvmlDeviceGetName(h)),
                }
                try:
                    info["power_limit_mw"] = int(nvml.nvmlDeviceGetEnforcedPowerLimit(h))
                except nvml.NVMLError:
                    info["power_limit_mw"] = None
                handles.append(h)
                gpus.append(info)
        except TelemetryAbsent:
            nvml.nvmlShutdown()
            raise
        except (nvml.NVMLError, ValueError) as e:
            nvml.nvmlShutdown()
            raise TelemetryAbsent(f"NVML cannot open device(s) {', '.join(devices)}: {_nvml_error(e)}") from None
        return cls(nvml, handles, gpus)

    def sample(self) -> list[GpuSample]:
        nvml = self.nvml
        rows = []
        for h, info in zip(self.handles, self.gpus, strict=True):
            errors: list[str] = []
            power = self._read(errors, "power_mw", nvml.nvmlDeviceGetPowerUsage, h)
            energy = self._read(errors, "energy_mj", nvml.nvmlDeviceGetTotalEnergyConsumption, h)
            util = self._read(errors, "utilization", nvml.nvmlDeviceGetUtilizationRates, h)
            mem = self._read(errors, "memory", nvml.nvmlDeviceGetMemoryInfo, h)
            clock = self._read(errors, "sm_clock_mhz", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)
            temperature = self._read(
                errors, "temperature_c", nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU
            )
            reasons = self._reasons
            throttle = self._read(errors, "throttle_reasons", reasons, h) if reasons is not None else None
            rows.append(
                GpuSample(
                    gpu_index=info["index"],
                    gpu_uuid=info["uuid"],
                    gpu_name=info["name"],
                    power_limit_mw=info.get("power_limit_mw"),
                    power_mw=power,
                    energy_mj=energy,
                    util_gpu_pct=util.gpu if util is not None else None,
                    util_mem_pct=util.memory if util is not None else None,
                    mem_used_bytes=mem.used if mem is not None else None,
                    mem_total_bytes=mem.total if mem is not None else None,
                    sm_clock_mhz=clock,
                    temperature_c=temperature,
                    throttle_reasons=throttle,
                    errors="; ".join(errors) or None,
                )
            )
        return rows

    def _read(self, errors: list[str], name: str, query: Callable[..., Any], *args: Any) -> Any:
        """One NVML query; a field the device does not support is None, with the reason added to ``errors``."""
        try:
            return query(*args)
        except self.nvml.NVMLError as e:
            errors.append(f"{name}: {e}")
            return None

    def close(self) -> None:
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# ---------------------------------------------------------------------------------------------------------- sim
class _SimGpus(BaseModel):
    """The simulator's ``GET /sim/gpu`` answer (rig/sim/power.py)."""

    gpus: list[dict[str, Any]]


class SimulatedSource:
    """The simulator's modelled GPUs (``GET /sim/gpu``); each row is labelled simulated."""

    source = SOURCE_SIMULATED

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, timeout_s: float = 2.0):
        self.url = base_url.rstrip("/") + SIM_PATH
        self.headers = dict(headers or {})
        self.timeout_s = timeout_s
        self.gpus = [
            {
                "index": s["gpu_index"],
                "uuid": s["gpu_uuid"],
                "name": s["gpu_name"],
                "power_limit_mw": s["power_limit_mw"],
            }
            for s in self.sample()
        ]

    def sample(self) -> list[GpuSample]:
        """The simulator's GPUs now, one JSON object each read into a row (a malformed answer is a ValueError, one
        without index, uuid or name a KeyError)."""
        req = urllib.request.Request(self.url, headers=self.headers)
        with urllib.request.urlopen(req, timeout=self.timeout_s) as r:  # noqa: S310 (the engine's own URL)
            gpus = _SimGpus.model_validate_json(r.read()).gpus
        return [
            GpuSample(
                gpu_index=g["index"],
                gpu_uuid=g["uuid"],
                gpu_name=g["name"],
                power_limit_mw=g.get("power_limit_mw"),
                power_mw=g.get("power_mw"),
                energy_mj=g.get("energy_mj"),
                util_gpu_pct=g.get("util_gpu_pct"),
                util_mem_pct=g.get("util_mem_pct"),
                mem_used_bytes=g.get("mem_used_bytes"),
                mem_total_bytes=g.get("mem_total_bytes"),
                sm_clock_mhz=g.get("sm_clock_mhz"),
                temperature_c=g.get("temperature_c"),
                throttle_reasons=g.get("throttle_reasons"),
                errors=None,
            )
            for g in gpus
        ]

    def close(self) -> None:
        pass


def open_source(
    engine: str,
    base_url: str | None,
    devices: list[str],
    headers: dict[str, str] | None = None,
    nvml: ModuleType | None = None,
) -> Source:
    """The telemetry source of a server: the simulator's model for ``sim``, else NVML on the assigned GPUs.
    Raises TelemetryAbsent with the reason."""
    if engine == "sim":
        if not base_url:
            raise TelemetryAbsent("the simulator has no URL yet")
        try:
            return SimulatedSource(base_url, headers)
        except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
            raise TelemetryAbsent(f"the simulator's {SIM_PATH} did not answer: {type(e).__name__}: {e}") from None
    return NvmlSource.open(devices, nvml)


# ---------------------------------------------------------------------------------------------------------- sampler
@dataclass
class SamplerStats:
    samples: int = 0  # sampling rounds that produced rows
    failed: int = 0  # rounds whose source raised (no rows written for them)
    last_error: str | None = None
    cpu_s: float = 0.0  # thread CPU time spent sampling (time.thread_time)
    wall_s: float = 0.0  # wall time inside sample()
    rows: int = 0
    rows_unwritten: int = 0  # rows the part writer still could not write at stop (a disk that stayed full)

    def report(self, source: str | None) -> GpuSamplerStats:
        """The figures as the point's entry records them (times rounded to the microsecond)."""
        return GpuSamplerStats(
            source=source,
            samples=self.samples,
            failed=self.failed,
            last_error=self.last_error,
            rows=self.rows,
            rows_unwritten=self.rows_unwritten,
            cpu_s=round(self.cpu_s, 6),
            wall_s=round(self.wall_s, 6),
        )


class GpuSampler:
    """Samples a source every ``interval_s`` on its own thread into a PartWriter: one round at start, one at stop,
    so the rows bracket the point's window."""

    def __init__(self, source: Source, writer: PartWriter, keys: dict[str, Any], interval_s: float):
        self.source = source
        self.writer = writer
        self.keys = keys  # run_id, point, node
        self.interval_s = interval_s
        self.stats = SamplerStats()
        self.latest_power_w: float | None = None  # the last round's power summed over the GPUs (the live view)
        self._stopping = False
        self._wake = threading.Event()
        self._extra: list[float] = []  # monotonic times of extra rounds (sample_at)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="rig-gpu-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def sample_once(self) -> None:
        c0, w0 = time.thread_time(), time.perf_counter()
        ts = time.time()
        try:
            rows = self.source.sample()
        except Exception as e:  # one failed round (e.g. the simulator busy) is counted, never fatal
            self.stats.failed += 1
            self.stats.last_error = f"{type(e).__name__}: {e}"[:200]
            rows = []
        took = time.perf_counter() - w0
        power = [p for p in (r.get("power_mw") for r in rows) if isinstance(p, (int, float))]
        if rows and len(power) == len(rows):
            self.latest_power_w = sum(power) / 1e3
        for r in rows:
            self.writer.add({**self.keys, "ts": ts, "source": self.source.source, "sample_s": took, **r})
        if rows:
            self.stats.samples += 1
            self.stats.rows += len(rows)
        self.stats.wall_s += took
        self.stats.cpu_s += time.thread_time() - c0

    def sample_at(self, wall_ts: float) -> None:
        """Take an extra round at this wall-clock time (the point's common start), so that a window's first end is
        bracketed within milliseconds rather than within an interval: the counter is interpolated there."""
        with self._lock:
            self._extra.append(time.monotonic() + (wall_ts - time.time()))
        self._wake.set()

    def _loop(self) -> None:
        next_t = time.monotonic()
        while not self._stopping:
            now = time.monotonic()
            with self._lock:
                extra_due = any(t <= now for t in self._extra)
                self._extra = [t for t in self._extra if t > now]
            if now >= next_t or extra_due:
                self.sample_once()
                try:
                    self.writer.maybe_flush()
                except OSError as e:  # disk full: the rows stay buffered, the writer retries on the next flush
                    self.stats.last_error = f"writing gpu_metrics: {e}"[:200]
                if now >= next_t:
                    next_t += self.interval_s
                    if next_t < now:  # fell behind (a slow call): skip the missed beats rather than burst
                        next_t = now + self.interval_s
            with self._lock:
                wake = min([next_t, *self._extra])
            self._wake.wait(max(0.0, wake - time.monotonic()))
            self._wake.clear()

    def stop(self) -> SamplerStats:
        """Stop the thread, take the closing round, write every buffered row."""
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.sample_once()
        try:
            self.writer.close()  # a transient disk error is retried there (PartWriter)
        except OSError as e:  # still failing: what was written stays, what was not is counted, the point goes on
            self.stats.rows_unwritten = self.writer.pending
            self.stats.last_error = f"gpu_metrics not written: {e.strerror or e}"
        return self.stats
