"""What a server configuration is: the knobs of one engine launch (one per sweep value of steps and server args)."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from rig.contracts.dialect import DialectName
from rig.contracts.request_fields import rig_field_reason
from rig.server import spec_schedule as sched
from rig.server.redaction import plain_secret, plain_secret_in_command

EngineName = Literal["sim", "sglang", "vllm", "external", "command"]
# Names a command template fills itself (rig/server/command.py), so no command_vars key may take them.
_RESERVED_VARS = {"extra_args", "api_key"}


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: EngineName = Field("sim", description="Engine (default sim).")
    model: str = Field("Qwen/Qwen3.5-122B-A10B", description="Model path or name passed to the engine.")
    served_model_name: str | None = Field(None, description="Name the engine serves the model as.")
    tp: int = Field(4, ge=1, le=64, description="Tensor parallel size (GPUs the server asks Ray for).")
    steps: int = Field(0, ge=0, le=32)  # 0: no speculative decoding
    spec_algorithm: str = Field(
        "NEXTN", description="SGLang --speculative-algorithm (NEXTN, EAGLE, EAGLE3, STANDALONE)."
    )  # NEXTN is MTP
    spec_method: str = Field("mtp", description="vLLM speculative method (ngram, mtp, eagle, eagle3).")
    eagle_topk: int = Field(1, ge=1)
    num_draft_tokens: int | None = Field(None, ge=1)  # default steps + 1 (chain)
    draft_model_path: str | None = Field(None, description="Draft model path (EAGLE/STANDALONE).")
    spec_schedule: sched.Schedule | None = Field(
        None,
        description="vLLM: speculative tokens by batch size (num_speculative_tokens_per_batch_size), as vLLM's JSON "
        "list [[start,end,K],...], START-END:K,... (1-2:4,3-64:1) or a file holding the list; K=0: no speculation "
        "in that range. Steps (num_speculative_tokens) default to the largest K.",
    )
    deterministic: bool = Field(
        False,
        description="SGLang/sim: --enable-deterministic-inference, so per-request seeds are honoured; it also "
        "changes the engine (pytorch sampler, prefix cache off unless fa3/fa4/triton attention).",
    )
    extra_args: tuple[str, ...] = Field(
        (),
        description="Extra engine argument, passed verbatim; repeat for each token "
        "(--server-arg=--foo --server-arg=1). ${NAME} is read from the environment at launch and never recorded.",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="The engine's extra environment; ${NAME} in a value as in extra_args."
    )
    device: Literal["gpu", "cpu"] = "gpu"
    port: int = Field(0, ge=0, le=65535, description="Server port (0 = any free port).")  # 30000 is SGLang's usual
    host: str | None = None  # bind address; default: the node's IP as Ray sees it
    url: str | None = Field(
        None, description="external engine: root URL of a server you already run (http://HOST:PORT)."
    )
    python: str | None = Field(None, description="Interpreter that runs the engine (its own venv).")  # default: rig's
    command: tuple[str, ...] = Field(
        (),
        description="command engine: the server's command line, with placeholders {model} {host} {port} {steps} "
        "{num_draft_tokens} {tp} {served_model_name} {extra_args} {api_key} and any --grid knob (one string, "
        "split as a shell would; never run by a shell); ${NAME} is read from the environment at launch.",
    )
    # command engine: values of the template's own placeholders ({ctx}); --grid ctx=2048,4096 sweeps one
    command_vars: dict[str, str | int | float | bool] = Field(default_factory=dict)
    sim_profile: str | None = None  # sim only: a profile file (default: the shipped reference profile)
    health_timeout_s: float = Field(1800.0, gt=0)  # model loads take minutes
    dialect: DialectName | None = Field(
        None,
        description="Request fields the server accepts: plain (OpenAI's API reference only), sglang or vllm "
        "(their extensions: ignore_eos, top_k, token ids, ...). Default: the engine's; external: "
        "probed, else plain.",
    )
    extra_body: dict[str, JsonValue] = Field(
        default_factory=dict,
        description="JSON field added to every request body, KEY=JSON (repeatable), for engines rig does not know.",
    )
    # nothing answering means: refused, no route, or no /health
    unreachable_timeout_s: float = Field(
        30.0,
        gt=0,
        description="external engine: seconds nothing may answer at --url before the run fails (default 30).",
    )

    @field_validator("command", mode="before")
    @classmethod
    def _split_command(cls, v: object) -> object:
        """One string (the command line's --command) is split into arguments as a shell would, and never run by one."""
        if isinstance(v, str):
            import shlex

            try:
                return tuple(shlex.split(v))
            except ValueError as e:  # "No closing quotation"
                raise ValueError(f"cannot split into arguments: {e}") from None
        return v

    @field_validator("command_vars")
    @classmethod
    def _var_names(cls, v: dict[str, object]) -> dict[str, object]:
        for key in v:
            if not key.isidentifier():
                raise ValueError(f"{key!r} is not a placeholder name (letters, digits and _)")
            if key in cls.model_fields or key in _RESERVED_VARS:
                raise ValueError(
                    f"{key!r} is a server setting of its own; set it as server.{key}"
                    if key in cls.model_fields
                    else f"{{{key}}} is filled by rig itself"
                )
        return v

    @field_validator("extra_args")
    @classmethod
    def _no_plain_secret(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        why = plain_secret(v)
        if why is not None:
            raise ValueError(why)
        return v

    @field_validator("spec_schedule", mode="before")
    @classmethod
    def _schedule(cls, v: object) -> object:
        return None if v is None else sched.parse(v)

    @field_validator("spec_algorithm")
    @classmethod
    def _upper(cls, v: str) -> str:
        return v.upper()

    @field_validator("spec_method")
    @classmethod
    def _known_method(cls, v: str) -> str:
        allowed = {"ngram", "mtp", "eagle", "eagle3", "draft_model", "suffix"}
        if v not in allowed:
            raise ValueError(f"must be one of {', '.join(sorted(allowed))}")
        return v

    @field_validator("extra_body")
    @classmethod
    def _extra_body(cls, v: dict[str, JsonValue]) -> dict[str, JsonValue]:
        # Refused rather than sent and flagged: every figure rig derives reads the record's own fields, so a body that
        # contradicts them measures something else under their name (rig.contracts.request_fields.rig_field_reason).
        for key, value in v.items():
            why = rig_field_reason(key)
            if why is not None:
                raise ValueError(f"{key!r} is rig's own field: {why}; drop it")
            bad = _not_finite(value)
            if bad is not None:
                where = f"{key}{bad[0]}"
                raise ValueError(f"{where} is {bad[1]}, which JSON cannot carry (it would be sent as null)")
        return v

    @field_validator("url")
    @classmethod
    def _root_url(cls, v: str | None) -> str | None:
        """http(s)://HOST[:PORT] and nothing after it: rig appends /health, /v1/... itself."""
        if v is None:
            return v
        from urllib.parse import urlsplit

        example = "e.g. http://127.0.0.1:30000"
        parts = urlsplit(v.strip())
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"must start with http:// or https:// ({example})")
        if not parts.hostname:
            raise ValueError(f"names no host ({example})")
        try:
            port = parts.port
        except ValueError:
            raise ValueError("port must be a number from 1 to 65535") from None
        if port == 0:
            raise ValueError("port must be a number from 1 to 65535")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            tail = parts.path + (("?" + parts.query) if parts.query else "")
            raise ValueError(
                f"give the server's root URL without {tail!r} (rig adds /health, /v1/... itself; {example})"
            )
        return v.strip().rstrip("/")

    @model_validator(mode="after")
    def _consistent(self) -> ServerConfig:
        if self.engine == "external" and not self.url:
            raise ValueError("engine 'external' needs server.url (the URL of the server you run)")
        if self.engine == "command" and not self.command:
            raise ValueError("engine 'command' needs server.command (--command 'SERVER {model} --port {port} ...')")
        if self.engine != "command" and (self.command or self.command_vars):
            raise ValueError(f"command is for engine 'command' (the engine is {self.engine!r})")
        why = plain_secret_in_command(self.command, self.command_vars)
        if why is not None:
            raise ValueError(why)
        if self.spec_algorithm == "STANDALONE" and self.steps > 0 and not self.draft_model_path:
            raise ValueError("spec_algorithm STANDALONE needs draft_model_path")
        if self.spec_schedule is not None:
            why = sched.refusal(self.spec_schedule, self.engine, self.steps, self.extra_args)
            if why is not None:
                raise ValueError(why)
        return self

    def knobs(self) -> dict:
        """The knobs that distinguish one configuration from another (recorded on every row)."""
        d = self.model_dump(exclude={"env", "health_timeout_s", "unreachable_timeout_s", "port", "host", "url"})
        d["extra_args"] = list(self.extra_args)
        if not d["deterministic"]:
            del d["deterministic"]  # absent when off: ids of configurations from before the knob stay the same
        for key in ("command", "command_vars"):  # likewise for engines other than command
            if not d[key]:
                del d[key]
            elif key == "command":
                d[key] = list(d[key])
        for key in ("dialect", "extra_body", "spec_schedule"):  # likewise when unset
            if not d[key]:
                del d[key]
        if "spec_schedule" in d:
            d["spec_schedule"] = sched.as_json(d["spec_schedule"])
        return d

    def config_id(self) -> str:
        """A short, stable, readable id: steps (or ``sched``: steps by batch size) plus a hash of every other knob."""
        blob = json.dumps(self.knobs(), sort_keys=True)
        steps = "sched" if self.scheduled else f"s{self.steps}"
        return f"{self.engine}-{steps}-{hashlib.sha1(blob.encode()).hexdigest()[:8]}"

    @property
    def scheduled(self) -> bool:
        """Speculation follows a batch-size schedule (vLLM's num_speculative_tokens_per_batch_size), not fixed steps."""
        return self.spec_schedule is not None and self.steps > 0


def _not_finite(value: JsonValue, where: str = "") -> tuple[str, float] | None:
    """(path, value) of the first NaN or infinity inside a JSON value, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = _not_finite(v, f"{where}.{k}" if isinstance(k, str) else f"{where}[{k}]")
        if found is not None:
            return found
    return None
