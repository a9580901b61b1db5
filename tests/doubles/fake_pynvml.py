"""A test double of ``pynvml`` (nvidia-ml-py 13.615, pynvml.py) for the GPU sampler, as strict as the real module.

What it keeps from pynvml.py: the function names and signatures rig calls (nvmlInit, nvmlShutdown,
nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex, nvmlDeviceGetHandleByUUID, nvmlDeviceGetIndex, nvmlDeviceGetUUID,
nvmlDeviceGetName, nvmlDeviceGetPowerUsage, nvmlDeviceGetTotalEnergyConsumption, nvmlDeviceGetUtilizationRates,
nvmlDeviceGetMemoryInfo, nvmlDeviceGetClockInfo, nvmlDeviceGetTemperature, nvmlDeviceGetCurrentClocksEventReasons,
nvmlDeviceGetEnforcedPowerLimit); the units (power and limits in mW, energy in mJ since the driver loaded,
utilisation in %, memory in bytes, clocks in MHz, temperature in C, a uint64 bitmask of clock event reasons);
the constants' values (NVML_CLOCK_SM = 1, NVML_TEMPERATURE_GPU = 0); and the error types: every failure is an
``NVMLError`` subclass chosen by code, as ``_extractNVMLErrorsAsClasses`` builds them (NVMLError_LibraryNotFound = 12
when libnvidia-ml.so.1 cannot be loaded, NVMLError_NotSupported = 3, NVMLError_Uninitialized = 1 for any call before
nvmlInit or after nvmlShutdown, NVMLError_NotFound = 6 for an unknown UUID, NVMLError_InvalidArgument = 2 for an
index out of range). Names and strings returned as ``str`` (pynvml's convertStrBytes decodes them on Python 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_LIBRARY_NOT_FOUND = 12

_STRINGS = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    6: "Not Found",
    12: "NVML Shared Library Not Found",
}


class NVMLError(Exception):
    _valClassMapping: dict[int, type] = {}

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value  # type: ignore[attr-defined]
        return obj

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"NVML Error with code {self.value}")  # type: ignore[attr-defined]


def _error_class(name: str, code: int) -> type:
    cls = type(name, (NVMLError,), {"__new__": lambda typ, *a: NVMLError.__new__(typ, code)})
    NVMLError._valClassMapping[code] = cls
    return cls


NVMLError_Uninitialized = _error_class("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _error_class("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _error_class("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NotFound = _error_class("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_LibraryNotFound = _error_class("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)


@dataclass
class FakeGpu:
    """One GPU's state; tests move it (energy_mj grows, power changes) between samples."""

    uuid: str
    name: str = "NVIDIA H200"
    power_mw: int = 80_000
    energy_mj: int = 1_000_000
    util_gpu: int = 0
    util_mem: int = 0
    mem_used: int = 1 << 30
    mem_total: int = 141 << 30
    sm_clock_mhz: int = 345
    temperature_c: int = 30
    event_reasons: int = 0x1  # nvmlClocksEventReasonGpuIdle
    power_limit_mw: int = 700_000
    unsupported: set[str] = field(default_factory=set)  # names of calls this GPU answers NotSupported


class _Handle:
    def __init__(self, index: int):
        self.index = index


class FakeNvml:
    """The module's state: the node's GPUs, whether the library loads, whether nvmlInit has run."""

    def __init__(self, gpus: list[FakeGpu], library: bool = True):
        self.gpus = gpus
        self.library = library
        self.initialized = 0
        self.calls: list[str] = []

    def module(self) -> SimpleNamespace:
        """A namespace exposing pynvml's names (what ``import pynvml`` would give)."""
        ns: dict[str, Any] = {k: v for k, v in globals().items() if k.startswith(("NVML", "NVMLError"))}
        for name in dir(self):
            if name.startswith("nvml"):
                ns[name] = getattr(self, name)
        return SimpleNamespace(**ns)

    # ---- library ----
    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if not self.library:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        self._check()
        self.initialized -= 1

    def _check(self) -> None:
        if self.initialized <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: _Handle, call: str) -> FakeGpu:
        self._check()
        self.calls.append(call)
        g = self.gpus[handle.index]
        if call in g.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return g

    # ---- devices ----
    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._check()
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> _Handle:
        self._check()
        for i, g in enumerate(self.gpus):
            if g.uuid == uuid:
                return _Handle(i)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:
        self._check()
        return handle.index

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    # ---- readings ----
    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> SimpleNamespace:
        g = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=g.util_gpu, memory=g.util_mem)  # c_nvmlUtilization_t: gpu, memory (%)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: Any = None) -> SimpleNamespace:
        g = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=g.mem_total, free=g.mem_total - g.mem_used, used=g.mem_used)  # c_nvmlMemory_t

    def nvmlDeviceGetClockInfo(self, handle: _Handle, type: int) -> int:
        g = self._gpu(handle, "nvmlDeviceGetClockInfo")
        if type != NVML_CLOCK_SM:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return g.sm_clock_mhz

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        g = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return g.temperature_c

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").event_reasons

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        return self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw
