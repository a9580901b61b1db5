"""WorkloadSpec: what requests a workload generates, validated up front (every bad value is one line naming the key).

Defaults (``DEFAULTS`` below; the sampling defaults depend on the workload):

================================  ===========================  ==============================================
option                            default                      where the number comes from
================================  ===========================  ==============================================
temperature / top_p / top_k       0.7 / 0.95 / -1              common chat-serving settings; greedy: 0 / 1 / -1
ignore_eos                        False                        EOS honoured; greedy: True (the campaign's)
max_tokens                        None                         set: every request uses it (overrides all below)
chat_prompt_tokens                median 100, sigma 1.0,       ShareGPT means as reported in the vLLM paper
                                  [8, 4000]                    (~161 input / ~338 output tokens); LMSYS-Chat-1M
chat_output_tokens                median 250, sigma 0.8,       reports shorter turns (~70 / ~215). Lognormal
                                  [16, 2048]                   means: 165 and 344. Adjust for your traffic.
code_fraction                     0.3                          our assumption: coding is a large minority of
                                                               assistant traffic
code_prompt_tokens                median 700, sigma 0.6,       our assumption: an instruction plus a file
                                  [100, 6000]                  excerpt of a few hundred to a few thousand tokens
code_output_tokens                median 400, sigma 0.6,       our assumption: explanations, refactors and
                                  [32, 2048]                   tests run longer than chat replies
agent_turns                       median 6, sigma 0.5, [2, 20] our assumption for a short agent task
agent_output_tokens               median 200, sigma 0.7,       agents mostly emit short tool calls and notes
                                  [16, 1024]
tool_output_tokens                median 800, sigma 0.8,       file reads, grep and test logs: hundreds to
                                  [50, 8000]                   thousands of tokens per tool result
think_time_s                      median 1.5, sigma 1.0,       tool execution time between turns (our guess)
                                  [0, 60]
agent_max_context_tokens          32000                        stop adding turns before the conversation would
                                                               exceed this (estimated, replies at max_tokens)
text/code_chars_per_token         4.5 / 3.5                    measured, see rig/workloads/lengths.py
fallback_max_tokens (dataset)     512                          for entries with no max_tokens of their own
cycle (dataset)                   False                        a file is a finite set of requests; asking for
                                                               more returns all of them (True: repeat the file)
================================  ===========================  ==============================================

Length distributions are ``Dist``: lognormal with a median and sigma (``median * exp(sigma * N(0,1))``), clipped to
[min, max]; a plain number means a constant. A partial mapping (``{median: 500}``) keeps the workload's other
defaults, and so does a dotted key (``chat_prompt_tokens.median: 500``). For ``realistic`` and ``agentic`` the
output distribution sets ``max_tokens``; with EOS honoured the real
output can be shorter. Options that do not apply to the chosen workload are accepted and ignored, so one set of
options can serve a sweep over several workloads.
"""

from __future__ import annotations

import math
from typing import Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rig.workloads.errors import WorkloadError
from rig.workloads.lengths import CODE_CHARS_PER_TOKEN, MAX_TOKENS_LIMIT, TEXT_CHARS_PER_TOKEN, Dist

WorkloadName = Literal["greedy", "realistic", "agentic", "dataset"]


def _dist(median: float, sigma: float, lo: float, hi: float) -> dict[str, float]:
    return {"median": median, "sigma": sigma, "min": lo, "max": hi}


# Per-workload defaults that differ from the field defaults (filled in before validation).
_NAME_DEFAULTS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "ignore_eos": True},
    "realistic": {},
    "agentic": {},
    "dataset": {},
}
_DIST_DEFAULTS: dict[str, dict[str, float]] = {
    "chat_prompt_tokens": _dist(100, 1.0, 8, 4000),
    "chat_output_tokens": _dist(250, 0.8, 16, 2048),
    "code_prompt_tokens": _dist(700, 0.6, 100, 6000),
    "code_output_tokens": _dist(400, 0.6, 32, 2048),
    "agent_turns": _dist(6, 0.5, 2, 20),
    "agent_output_tokens": _dist(200, 0.7, 16, 1024),
    "tool_output_tokens": _dist(800, 0.8, 50, 8000),
    "think_time_s": _dist(1.5, 1.0, 0, 60),
}
_MAX_TOKENS_LIMIT = MAX_TOKENS_LIMIT  # rig.workloads.lengths says why
_TOKEN_DISTS = (
    "chat_prompt_tokens",
    "chat_output_tokens",
    "code_prompt_tokens",
    "code_output_tokens",
    "agent_turns",
    "agent_output_tokens",
    "tool_output_tokens",
)


class Sampling(TypedDict):
    """The sampling parameters of a turn (keyword arguments of rig.workloads.base.Turn)."""

    temperature: float
    top_p: float
    top_k: int
    ignore_eos: bool


class WorkloadSpec(BaseModel):
    """One workload and its options; see the module docstring for every default and its source."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: WorkloadName
    # sampling (sent with every request)
    temperature: float = Field(0.7, ge=0, le=100)
    top_p: float = Field(0.95, gt=0, le=1)
    top_k: int = -1
    ignore_eos: bool = False
    max_tokens: int | None = Field(None, ge=1, le=_MAX_TOKENS_LIMIT)
    # realistic
    code_fraction: float = Field(0.3, ge=0, le=1)
    chat_prompt_tokens: Dist = Dist(**_DIST_DEFAULTS["chat_prompt_tokens"])
    chat_output_tokens: Dist = Dist(**_DIST_DEFAULTS["chat_output_tokens"])
    code_prompt_tokens: Dist = Dist(**_DIST_DEFAULTS["code_prompt_tokens"])
    code_output_tokens: Dist = Dist(**_DIST_DEFAULTS["code_output_tokens"])
    code_dir: str | None = None  # source tree for code prompts; None: this Python's standard library
    text_chars_per_token: float = Field(TEXT_CHARS_PER_TOKEN, gt=0, le=20)
    code_chars_per_token: float = Field(CODE_CHARS_PER_TOKEN, gt=0, le=20)
    # agentic
    agent_turns: Dist = Dist(**_DIST_DEFAULTS["agent_turns"])
    agent_output_tokens: Dist = Dist(**_DIST_DEFAULTS["agent_output_tokens"])
    tool_output_tokens: Dist = Dist(**_DIST_DEFAULTS["tool_output_tokens"])
    think_time_s: Dist = Dist(**_DIST_DEFAULTS["think_time_s"])
    agent_max_context_tokens: int = Field(32000, ge=256, le=10_000_000)
    # dataset
    path: str | None = None
    format: Literal["auto", "sharegpt", "jsonl"] = "auto"
    shuffle: bool = False  # seeded permutation of the entries (drops timestamps: a shuffled trace is not a trace)
    use_reply_length: bool = False  # ShareGPT: the first gpt reply's estimated tokens become max_tokens
    use_timestamps: bool = True  # JSONL `timestamp` -> Session.arrival_s
    cycle: bool = False  # more sessions than entries: repeat the file (True) or stop at its end (False)
    fallback_max_tokens: int = Field(512, ge=1, le=_MAX_TOKENS_LIMIT)

    def __init__(self, **data: Any) -> None:
        """Validate; any problem becomes a one-line WorkloadError naming the key."""
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise WorkloadError(_one_line(e)) from None

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> WorkloadSpec:
        """Like pydantic's, but errors are one-line WorkloadErrors."""
        if not isinstance(obj, dict):
            raise WorkloadError(f"workload: expected a mapping of options, got {type(obj).__name__}")
        return cls(**obj)

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data: Any) -> Any:
        # Fill the workload's own defaults and merge partial distributions with the defaults, before validation.
        if not isinstance(data, dict):
            return data
        out = dict(data)
        # Dotted keys (`--workload-opt chat_prompt_tokens.median=300`) address one field of a distribution.
        for key in [k for k in out if isinstance(k, str) and "." in k]:
            head, _, field = key.partition(".")
            if head in _DIST_DEFAULTS and isinstance(out.get(head, {}), dict):
                out[head] = {**out.get(head, {}), field: out.pop(key)}
        name = out.get("name")
        if isinstance(name, str):
            for key, value in _NAME_DEFAULTS.get(name, {}).items():
                out.setdefault(key, value)
        for key, default in _DIST_DEFAULTS.items():
            if isinstance(out.get(key), dict):
                out[key] = {**default, **out[key]}
        return out

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v != -1 and v < 1:
            raise ValueError("must be -1 (disabled) or >= 1")
        return v

    @field_validator(*_TOKEN_DISTS)
    @classmethod
    def _token_range(cls, v: Dist) -> Dist:
        if v.min < 1:
            raise ValueError(f"min must be >= 1 (got {v.min:g})")
        if v.max > _MAX_TOKENS_LIMIT:
            raise ValueError(f"max must be <= {_MAX_TOKENS_LIMIT} (got {v.max:g})")
        return v

    @field_validator("think_time_s")
    @classmethod
    def _think_range(cls, v: Dist) -> Dist:
        if v.max > 3600:
            raise ValueError(f"max must be <= 3600 seconds (got {v.max:g})")
        return v

    @model_validator(mode="after")
    def _workload_needs(self) -> WorkloadSpec:
        if self.name == "dataset":
            if not self.path:
                raise ValueError("path is required for the dataset workload (a ShareGPT .json or a .jsonl file)")
            # Read the file now (cached), so a bad file stops the run before any server starts.
            from rig.workloads.datafile import read_dataset

            read_dataset(
                self.path,
                self.format,
                use_reply_length=self.use_reply_length,
                chars_per_token=self.text_chars_per_token,
            )
        return self

    def sampling(self) -> Sampling:
        """The sampling parameters every turn of this workload carries."""
        return Sampling(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, ignore_eos=self.ignore_eos)


def _one_line(err: ValidationError) -> str:
    """The first validation problem as ``workload.<key>: <what> (got <value>)`` on one line."""
    first = err.errors()[0]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, WorkloadError):  # a dataset file's own message already names the file and line
        return str(cause)
    loc = ".".join(str(p) for p in first["loc"])
    msg = str(first["msg"]).removeprefix("Value error, ").replace("\n", " ")
    if first["type"] == "extra_forbidden":
        msg = "unknown option"
    value = first.get("input")
    shown = ""
    if not isinstance(value, dict) and first["type"] != "missing" and "(got " not in msg:
        text = repr(value)
        shown = f" (got {text[:60] + '...' if len(text) > 60 else text})"
    if isinstance(value, float) and not math.isfinite(value):
        shown = f" (got {value})"
    more = f" [+{len(err.errors()) - 1} more]" if len(err.errors()) > 1 else ""
    return f"workload{'.' + loc if loc else ''}: {msg}{shown}{more}"
