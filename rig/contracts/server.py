"""The server actor's answers over Ray (rig.server.actor, read by rig.run.lifecycle and rig.run.execute) and the
effective configuration a server ran with (rig.server.effective, recorded per server configuration)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, with_config
from typing_extensions import TypedDict

KnobValue = str | int | float | bool | None
Knobs = dict[str, KnobValue]  # knob name -> value, as points are labelled (steps, eagle_topk, ...)


class ServerStarted(BaseModel):
    """``start()``: the engine's command (secrets masked) and where it serves."""

    model_config = ConfigDict(extra="forbid")

    command: list[str] = Field(default_factory=list)  # empty for a server rig did not launch
    url: str | None = None
    node_ip: str | None = None
    node_id: str | None = None  # None outside Ray
    gpu_ids: list[str] | None = None  # what Ray assigned the actor (None: nothing launched)
    pid: int | None = None


class ServerReady(BaseModel):
    """``wait_ready()``: how long the server took to answer 200, and the path that did."""

    model_config = ConfigDict(extra="forbid")

    ready_after_s: float
    probe: str


class WaitProgress(BaseModel):
    """``wait_progress()``: a wait_ready in progress, its elapsed seconds and the last answer (or error) seen."""

    model_config = ConfigDict(extra="forbid")

    elapsed_s: float = 0.0
    last: str = "not started"


@with_config(ConfigDict(extra="allow"))  # an older rig's log parser may have recorded other keys
class StartupFacts(TypedDict, total=False):
    """What an engine's startup log says about its capacity (rig.server.engines ``parse_startup_log``): SGLang's
    capacity line, vLLM's KV cache, init and speculative config lines. Absent keys: the log did not say."""

    max_total_num_tokens: int
    chunked_prefill_size: int
    max_prefill_tokens: int
    max_running_requests: int
    context_len: int
    available_mem_gb: float
    kv_cache_device: str
    kv_cache_tokens: int
    max_model_len: int
    max_concurrency: float
    init_engine_s: float
    spec_method: str  # vLLM's engine config line: speculative_config=SpeculativeConfig(method=..., num_spec_tokens=N)
    num_spec_tokens: int
    spec_schedule_disabled: bool  # vLLM turned num_speculative_tokens_per_batch_size off (data parallelism)


class ServerDescription(BaseModel):
    """``describe()``: each info path's JSON answer (or ``{"http_status": N}`` / ``{"error": ...}``), secrets
    masked, and the startup log's facts."""

    model_config = ConfigDict(extra="forbid")

    info: dict[str, Any] = Field(default_factory=dict)  # path -> the engine's own JSON, as it came
    startup: StartupFacts = Field(default_factory=lambda: StartupFacts())


class FlushAnswer(BaseModel):
    """``flush_cache()``: the HTTP status of POST /flush_cache (None: not sent or no answer) and the body's start."""

    model_config = ConfigDict(extra="forbid")

    status: int | None = None
    body: str = ""


class GpuTelemetry(BaseModel):
    """``open_telemetry()``, and the manifest's record for one server configuration (rig.server.gpu_telemetry):
    where the GPU samples come from, or why there are none."""

    model_config = ConfigDict(extra="forbid")

    source: Literal["nvml", "simulated"] | None = None  # None: absent
    absent_reason: str | None = None
    gpus: list[dict[str, Any]] = Field(default_factory=list)  # NVML index, uuid, name, power limit (mW)
    node_ip: str | None = None
    clock_offset_s: float | None = None  # server node clock - driver clock (gpu_metrics ts - offset = driver time)
    note: str | None = None  # e.g. that simulated figures come from the simulator's power model


class GpuSamplerStats(BaseModel):
    """``gpu_stats()``: the GPU sampler's figures over the last point (recorded on the point's entry)."""

    model_config = ConfigDict(extra="forbid")

    source: str | None = None
    samples: int = 0  # sampling rounds that produced rows
    failed: int = 0  # rounds whose source raised (no rows written for them)
    last_error: str | None = None
    rows: int = 0
    rows_unwritten: int = 0  # rows the part writer still could not write at stop
    cpu_s: float = 0.0  # thread CPU time spent sampling
    wall_s: float = 0.0  # wall time inside the source's sample()


class KnobChange(BaseModel):
    """A requested value the server changed."""

    model_config = ConfigDict(extra="allow")

    knob: str
    requested: KnobValue = None
    effective: KnobValue = None


class EffectiveConfig(BaseModel):
    """What a server really ran with against what was asked (rig.server.effective), and whether it honours
    per-request sampling seeds (None: unknown). Older manifests may lack some keys (read as their defaults)."""

    model_config = ConfigDict(extra="allow")

    requested: Knobs = Field(default_factory=dict)
    effective: Knobs = Field(default_factory=dict)
    changed: list[KnobChange] = Field(default_factory=list)
    seeds_honoured: bool | None = None
