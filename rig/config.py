"""RunSpec: everything a run or sweep needs, from YAML and CLI flags, validated before anything starts.

Every bad value becomes a ``SpecError`` with one line naming the key and the value (the CLI exits 2).
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from rig.cluster_spec import ClusterSpec
from rig.contracts import Thresholds
from rig.contracts.profile import LoadPhase, ProfileKind, fit_profile, parse_profile, peak_of
from rig.server import spec_schedule
from rig.server.redaction import mask_argv, mask_command_line
from rig.server.spec import ServerConfig
from rig.spec_yaml import SpecError, deep_merge
from rig.workloads.spec import WorkloadSpec

_LIMITS = Thresholds()

ApiName = Literal["sglang-native", "openai-completions", "openai-chat"]
LoadMode = Literal["closed", "poisson", "gamma", "trace"]
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# More in-flight requests than a rig run can hold (100,000 slots already swamp a generator's loop; each slot is a
# task and a connection): a level above this is a typo, refused before anything starts.
MAX_LEVEL = 1_000_000
# Sessions a fixed-count level builds up front in the driver (as rig.run.plans.LAZY_SESSION_LIMIT bounds a
# duration-bound one); more would take the driver's memory before the first request. --duration is for longer levels.
MAX_REQUESTS = 10_000_000


# ServerConfig fields --grid cannot sweep (one per launch is not a server knob, or is set another way)
_NOT_SWEPT = frozenset({"engine", "steps", "env", "url", "host", "port", "python", "command", "command_vars"})


# A request's timeouts below this cannot be met by any server (a loopback round trip and a first byte take longer;
# 2 ms was recorded as an internal error): refused, as a typo for seconds.
MIN_TIMEOUT_S = 0.01


class Timeouts(BaseModel):
    """How long one request may take, by phase: the spec's values, which the load generator's client enforces."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    connect_s: float = Field(10.0, ge=MIN_TIMEOUT_S)
    # queueing counts
    first_token_s: float = Field(600.0, ge=MIN_TIMEOUT_S, description="Seconds to wait for a first token.")
    total_s: float = Field(3600.0, ge=MIN_TIMEOUT_S, description="Seconds a whole request may take.")


class LoadSpec(BaseModel):
    """How load is offered at each level of a point."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # inf or nan is no rate, duration or spread

    mode: LoadMode = Field("closed", description="Load pattern.")
    concurrency: list[int] = Field(
        default_factory=lambda: [1, 4, 16, 32, 64],
        description="Closed-loop levels, e.g. 1,4,16,32,64; open loop: in-flight cap.",
    )
    rates: list[float] = Field(default_factory=list, description="Open-loop arrival rates in requests/s, e.g. 1,2,4.")
    burstiness: float = Field(1.0, gt=0, description="gamma: coefficient of variation of inter-arrivals.")  # 1: Poisson
    max_concurrency: int | None = Field(None, ge=1, le=MAX_LEVEL)  # open loop: cap on in-flight requests (whole point)
    # open loop: rate x a minute; the closed-loop rule is requests_for()
    requests: int | None = Field(
        None, ge=1, le=MAX_REQUESTS, description="Sessions per level (default: 4 at C=1, 2xC otherwise)."
    )
    duration_s: float | None = Field(None, gt=0, description="Seconds per level (instead of a request count).")
    grace_s: float = Field(
        10.0,
        ge=0,
        description="With --duration: seconds in-flight requests may run past a level's "
        "end before they are cancelled (default 10).",
    )
    warmup_requests: int = Field(1, ge=0, description="Warm-up requests per generator, kept out of the results.")
    trace_speed: float = Field(1.0, gt=0, description="Trace replay speed factor.")  # >1 replays faster
    api: ApiName | None = None  # default: the engine's (sglang-native for sim and sglang)
    seed: int = Field(0, ge=0, lt=2**63, description="Workload seed (same seed, same requests on every point).")
    timeouts: Timeouts = Field(default_factory=Timeouts)
    # one point whose load changes over time (rig.contracts.profile); its duration is the phases' sum
    profile: list[LoadPhase] | None = Field(None, description="Load phases of one point, e.g. 1:60s,64:60s.")
    # the validity limits (rig.contracts.Thresholds) a run may set; its defaults are the contract's
    slip_threshold_s: float = Field(_LIMITS.slip_p99_ms / 1e3, gt=0)  # p99 schedule slip above this flags the point
    loop_lag_threshold_s: float = Field(_LIMITS.loop_lag_p99_ms / 1e3, gt=0)  # generator loop lag p99 above this

    @field_validator("concurrency")
    @classmethod
    def _positive_levels(cls, v: list[int]) -> list[int]:
        if any(c < 1 for c in v):
            raise ValueError("concurrency levels must be >= 1")
        if any(c > MAX_LEVEL for c in v):
            raise ValueError(f"a concurrency level of at most {MAX_LEVEL:,} (each slot is a task and a connection)")
        _no_duplicates(v, "concurrency level")
        return v

    @field_validator("rates")
    @classmethod
    def _positive_rates(cls, v: list[float]) -> list[float]:
        if any(r <= 0 for r in v):
            raise ValueError("rates must be > 0")
        _no_duplicates(v, "rate")
        return v

    @field_validator("profile", mode="before")
    @classmethod
    def _profile_text(cls, v: Any, info: ValidationInfo) -> Any:
        if not isinstance(v, str):
            return v
        kind: ProfileKind = "concurrency" if info.data.get("mode", "closed") == "closed" else "rate"
        from rig.contracts.errors import ContractError

        try:
            return parse_profile(v, kind)
        except ContractError as e:
            raise ValueError(str(e)) from None

    @model_validator(mode="after")
    def _levels_exist(self) -> LoadSpec:
        if self.profile:
            self.duration_s = fit_profile(self.profile, self.mode, self.requests, self.duration_s, self.rates)
            return self
        if self.mode in ("poisson", "gamma") and not self.rates:
            raise ValueError(f"mode {self.mode} needs at least one rate (--rate)")
        if self.mode == "closed" and not self.concurrency:
            raise ValueError("closed-loop mode needs at least one concurrency level")
        if self.mode in ("closed", "trace") and self.rates:
            raise ValueError(
                f"mode {self.mode} takes no rates (got {self.rates}); rates are for --mode poisson or gamma"
            )
        return self

    def levels(self) -> list[tuple[int | None, float | None]]:
        """(concurrency, rate) per level in order; a profile is one level at its peak."""
        if self.profile:
            peak = max(peak_of(p) for p in self.profile)
            return [(int(peak), None)] if self.mode == "closed" else [(self.max_concurrency, peak)]
        if self.mode == "closed":
            return [(c, None) for c in self.concurrency]
        if self.mode == "trace":
            return [(self.max_concurrency, None)]
        return [(self.max_concurrency, r) for r in self.rates]

    def requests_for(self, concurrency: int | None, rate: float | None) -> int | None:
        """Sessions to send at a level; None means 'until the duration ends' (or the whole trace)."""
        if self.requests is not None:
            return self.requests
        if self.duration_s is not None:
            return None
        if self.mode == "closed":
            assert concurrency is not None
            return 4 if concurrency == 1 else 2 * concurrency  # the campaign's rule
        if self.mode == "trace":
            return None
        return max(1, int(round((rate or 1.0) * 60.0)))  # a minute of arrivals


class RunSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(
        default_factory=lambda: time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2),
        description="Run directory name (default: timestamp).",
    )
    out: Path = Field(Path("results"), description="Results root (default results/).")
    server: ServerConfig = Field(default_factory=ServerConfig)
    workloads: list[WorkloadSpec] = Field(default_factory=lambda: [WorkloadSpec(name="realistic")])
    steps: list[int] = Field(default_factory=lambda: [4])
    server_grid: dict[str, list[Any]] = Field(default_factory=dict)  # other server knobs to sweep
    load: LoadSpec = Field(default_factory=LoadSpec)
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    clients: int = Field(1, ge=1, description="Load generators (default 1; one per client host).")
    repeat: int = Field(1, ge=1, description="Repeat every point n times.")
    metrics_interval_s: float = Field(1.0, gt=0, allow_inf_nan=False, description="Seconds between /metrics samples.")
    flush_cache: bool = Field(True, description="/flush_cache between points.")
    fail_fast: bool = Field(False, description="Stop at the first failed point.")
    # the key itself never enters the spec, manifest or logs
    api_key_env: str = Field(
        "RIG_API_KEY", description="Environment variable holding the API key (default RIG_API_KEY)."
    )
    api_key_file: Path | None = Field(None, description="File holding the API key.")

    @field_validator("run_id")
    @classmethod
    def _safe_run_id(cls, v: str) -> str:
        if not _RUN_ID.match(v):
            raise ValueError("use letters, digits, '.', '_' and '-' (max 128)")
        return v

    @field_validator("out")
    @classmethod
    def _out_dir(cls, v: Path) -> Path:
        if v.exists() and not v.is_dir():
            raise ValueError(f"{v} is a file; --out names the directory runs are written under")
        return v

    @field_validator("api_key_file")
    @classmethod
    def _key_file(cls, v: Path | None) -> Path | None:
        if v is None:
            return v
        if not v.exists():
            raise ValueError(f"no such file: {v}")
        if not v.is_file():
            raise ValueError(f"not a file: {v}")
        if not os.access(v, os.R_OK):
            raise ValueError(f"not readable: {v}")
        try:
            key = v.read_bytes().decode("utf-8").strip()
        except UnicodeDecodeError:
            raise ValueError(f"{v} is not a text file (an API key is one line of text)") from None
        except OSError as e:
            raise ValueError(f"{v}: {e.strerror}") from None
        if not key:
            raise ValueError(f"{v} is empty (no key would be sent); put the key in it, or drop --api-key-file")
        if len(key.split()) > 1 or not key.isprintable():
            # two lines (or a space) in a header value is refused by the client as header injection, which read
            # as the server's fault; the key itself is never shown
            raise ValueError(f"{v} holds more than one word or line; an API key is one line with no spaces")
        return v

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: list[int]) -> list[int]:
        if not v or any(s < 0 for s in v):
            raise ValueError("steps must be a non-empty list of integers >= 0")
        _no_duplicates(v, "steps value")
        return v

    @model_validator(mode="after")
    def _scheduled_steps(self) -> RunSpec:
        if self.server.spec_schedule is not None:  # steps default to the schedule's largest K
            given = self.steps if "steps" in self.model_fields_set else None
            self.steps = spec_schedule.steps_for(self.server.spec_schedule, given)
        return self

    @field_validator("workloads")
    @classmethod
    def _workloads(cls, v: list[WorkloadSpec]) -> list[WorkloadSpec]:
        if not v:
            raise ValueError("give at least one workload (an empty list would run nothing)")
        _no_duplicates([w.name for w in v], "workload")  # a point's id carries the workload's name
        return v

    @field_validator("server_grid")
    @classmethod
    def _grid_keys(cls, v: dict[str, list[Any]], info: ValidationInfo) -> dict[str, list[Any]]:
        allowed = set(ServerConfig.model_fields) - _NOT_SWEPT
        server = info.data.get("server")
        templated = server is not None and server.engine == "command"  # any name its template places: command_vars
        for key, values in v.items():
            if key not in allowed and not (templated and key.isidentifier() and key not in ServerConfig.model_fields):
                more = "" if templated else " (or, with engine command, any {name} its command places)"
                raise ValueError(f"cannot sweep {key!r}; sweepable: {', '.join(sorted(allowed))}{more}")
            if not isinstance(values, list) or not values:
                raise ValueError(f"{key}: give a non-empty list of values")
            _no_duplicates(values, f"{key} value")
        return v

    @property
    def run_dir(self) -> Path:
        return self.out / self.run_id

    def server_configs(self) -> list[ServerConfig]:
        """One per launch: the product of steps and the server grid, in a stable order, each as it will run
        (as_it_runs); two that would run the same are one launch."""
        configs: list[ServerConfig] = []
        for cfg in map(as_it_runs, self.asked_configs()):
            if cfg not in configs:
                configs.append(cfg)
        return configs

    def asked_configs(self) -> list[ServerConfig]:
        """The product of steps and the server grid as asked, each validated (SpecError)."""
        keys = sorted(self.server_grid)
        combos = itertools.product(*(self.server_grid[k] for k in keys)) if keys else [()]
        configs: list[ServerConfig] = []
        for combo in combos:
            for steps in self.steps:
                update: dict[str, Any] = dict(zip(keys, combo, strict=True), steps=steps)
                # a command template's own knobs (--grid ctx=...) land in command_vars
                own = {k: update.pop(k) for k in list(update) if k not in ServerConfig.model_fields}
                if own:
                    update["command_vars"] = {**self.server.command_vars, **own}
                try:
                    cfg = ServerConfig.model_validate({**self.server.model_dump(), **update})
                except ValidationError as e:
                    raise SpecError(_one_line(e, prefix="server")) from None
                _check_sim_flags(cfg)
                _check_command(cfg, len(self.steps))
                _check_adaptive(cfg)
                if any(c.config_id() == cfg.config_id() for c in configs):  # e.g. values YAML reads as equal
                    raise SpecError(
                        f"server: two configurations of the grid are the same server "
                        f"({cfg.config_id()}); list each value once"
                    )
                configs.append(cfg)
        return configs

    def api_for(self, engine_default: str) -> str:
        return self.load.api or engine_default


def as_it_runs(cfg: ServerConfig) -> ServerConfig:
    """The configuration with num_draft_tokens as SGLang (and the sim) will run it: with topk 1 it is steps + 1
    whatever was asked (arg_groups/speculative_hook.py::_handle_eagle_family), and without speculation it is not
    passed at all; likewise a vLLM schedule at steps 0 (no speculation to schedule). Planning and the records'
    server_args then state what ran."""
    if cfg.spec_schedule is not None and cfg.steps == 0:
        return cfg.model_copy(update={"spec_schedule": None})
    if cfg.engine not in ("sglang", "sim") or cfg.num_draft_tokens is None:
        return cfg
    if cfg.steps == 0:
        return cfg.model_copy(update={"num_draft_tokens": None})
    if cfg.spec_algorithm.upper() == "NGRAM":  # drafts are not steps: no steps + 1 rule (_handle_ngram)
        return cfg
    if cfg.eagle_topk == 1 and cfg.num_draft_tokens != cfg.steps + 1:
        return cfg.model_copy(update={"num_draft_tokens": cfg.steps + 1})
    return cfg


def _no_duplicates(values: list[Any], what: str) -> None:
    """Refuse a value listed twice: it would name the same point twice (one copy pending for ever, the run
    'partial'). Measuring a point again is what --repeat is for."""
    seen: list[Any] = []
    for x in values:
        if x in seen:
            raise ValueError(f"{what} {x!r} is listed twice; list each once (--repeat N measures every point N times)")
        seen.append(x)


def _check_sim_flags(cfg: ServerConfig) -> None:
    """The sim's own parser over the flags it will be started with: a bad one is refused before anything starts."""
    if cfg.engine != "sim":
        return
    if cfg.python:
        raise SpecError(
            "server.python: the sim always runs on the rig's own interpreter; --engine-python is for "
            "sglang and vllm (drop it)"
        )
    from rig.server.engines import engine_for
    from rig.sim.args import check_argv

    why = check_argv(engine_for("sim").argv(cfg, "127.0.0.1", 1)[3:])
    if why:
        shown = f" (steps={cfg.steps}, extra_args={list(cfg.extra_args)})"
        raise SpecError(f"server: the simulated server would refuse its flags: {why}{shown}")


def _check_adaptive(cfg: ServerConfig) -> None:
    """A --speculative-adaptive-config file is read now, as SGLang reads it at launch: a file it would refuse, or
    startup steps outside its candidates (SGLang refuses to launch, arg_groups/speculative_hook.py), is an error
    before anything starts."""
    from rig.contracts.adaptive import DEFAULT_SLOTS_0_5_23, AdaptiveTableError, steps_refusal
    from rig.server.adaptive import asked_adaptive, config_file_slots

    if not asked_adaptive(cfg) or cfg.engine == "external":  # an external server's file is on its own machine
        return
    try:
        slots = config_file_slots(cfg)
    except AdaptiveTableError as e:
        raise SpecError(f"server: {e}") from None
    if cfg.steps <= 0:
        return
    if slots is not None:
        why = steps_refusal(cfg.steps, slots)
    else:  # the default table: 0.5.23's union [0,1,3,5,7] holds 0.5.16/0.5.17's [0,1,3,7]; outside it every one refuses
        why = steps_refusal(cfg.steps, DEFAULT_SLOTS_0_5_23)
        why = why and f"{why} of SGLang's default table (0.5.23; 0.5.16/0.5.17: [0, 1, 3, 7])"
    if why:
        raise SpecError(f"server (steps={cfg.steps}): {why}; SGLang refuses to launch with it")


def _check_command(cfg: ServerConfig, n_steps: int) -> None:
    """A command template is filled for every configuration before anything starts: an unknown placeholder, a knob
    it does not place, or a steps sweep it ignores is refused here."""
    if cfg.engine != "command":
        return
    from rig.server.command import SPECULATIVE, TemplateError, expand, uses_speculation

    try:
        expand(cfg, "127.0.0.1", 1)
    except TemplateError as e:
        raise SpecError(f"server.command: {e}") from None
    if n_steps > 1 and not uses_speculation(cfg):
        raise SpecError(
            f"server.command places none of {', '.join('{' + n + '}' for n in SPECULATIVE)}: sweeping "
            f"steps would launch the same server again for each value (put {{steps}} where the "
            f"server takes it, or sweep one steps value)"
        )


def _one_line(err: ValidationError, prefix: str = "") -> str:
    first = err.errors()[0]
    # keys come from user YAML and may hold any character: quote the odd ones so the message stays one line
    loc = ".".join(str(p) if str(p).isidentifier() or isinstance(p, int) else repr(p) for p in first["loc"])
    loc = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
    value = first.get("input")
    # the refused value is shown, but never a secret flag's value (the refusal itself may be that it is in plain text)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = mask_argv(value)
    elif isinstance(value, str):
        value = mask_command_line(value)
    shown = "" if isinstance(value, dict) else f" (got {value!r})"
    msg = first["msg"].removeprefix("Value error, ")
    more = f" [+{len(err.errors()) - 1} more]" if len(err.errors()) > 1 else ""
    return f"{loc}: {msg}{shown}{more}" if loc else f"{msg}{shown}{more}"


def build_spec(yaml_data: dict[str, Any] | None, overrides: dict[str, Any]) -> RunSpec:
    """Merge YAML (lowest) with CLI overrides (highest) and validate into a RunSpec."""
    data = deep_merge(yaml_data or {}, overrides)
    try:
        spec = RunSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(_one_line(e)) from None
    configs = spec.server_configs()  # every server configuration of the grid, before anything starts (SpecError)
    if spec.server.engine == "external" and len(configs) > 1:
        # rig launches nothing for an external server, so it cannot apply a steps value or a grid knob: every
        # "configuration" would be the one server at --url, relabelled, and a comparison of them noise.
        raise SpecError(
            f"server.engine external: rig measures the one server at {spec.server.url} and cannot apply "
            f"steps or grid values to it, so {len(configs)} configurations would all be that same server; "
            f"give one --steps value (what it runs), or let rig launch the engine (--engine sglang, vllm "
            f"or sim)"
        )
    _check_trace(spec)
    _check_dialect(spec)
    return spec


def _check_dialect(spec: RunSpec) -> None:
    """SGLang's native /generate speaks only SGLang: another dialect asked for with it is refused here."""
    from rig.server.engines import engine_for

    dialect = spec.server.dialect
    api = spec.api_for(engine_for(spec.server.engine).default_api)
    if api == "sglang-native" and dialect not in (None, "sglang"):
        raise SpecError(
            f"server.dialect {dialect}: the sglang-native API (/generate) is SGLang's own; use --api "
            f"openai-completions or openai-chat with it (or drop --dialect)"
        )


def _check_trace(spec: RunSpec) -> None:
    """Trace replay needs a dataset whose entries carry timestamps: refused here, not after Ray and the server."""
    if spec.load.mode != "trace":
        return
    for wl in spec.workloads:
        if wl.name != "dataset":
            raise SpecError(
                f"load.mode trace replays a dataset's timestamps; workload {wl.name!r} has none (use --dataset FILE)"
            )
        from rig.workloads.dataset import entries_for
        from rig.workloads.errors import WorkloadError

        try:
            entries = entries_for(wl)
        except WorkloadError as e:
            raise SpecError(str(e)) from None
        if not entries or entries[0].timestamp is None:
            raise SpecError(
                f"load.mode trace: {wl.path} has no 'timestamp' on its entries; give timestamps or use "
                f"--mode closed / poisson"
            )
