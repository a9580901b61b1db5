"""Validating request sampling parameters the way SGLang does (unknown keys are a 400 in 0.5.23)."""

from __future__ import annotations

from typing import Any

from rig.sim.requests import Sampling

# api/v1/api_types.py::_FIELDS_SamplingParams (0.5.23), in its order: the keys /generate's contract admits.
NATIVE_FIELDS = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
)
NATIVE_KEYS = frozenset(NATIVE_FIELDS)


class BadRequest(ValueError):
    """A request the server rejects with 400."""


class ContractError(BadRequest):
    """/generate's schema check failed (api/v1/api_types.py): 400 with {"error": "<serde-style text>"}."""


def _num(d: dict, key: str, default: float, lo: float | None = None, hi: float | None = None) -> float:
    v = d.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadRequest(f"sampling_params.{key}: expected a number, got {v!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise BadRequest(f"sampling_params.{key} must be in [{lo}, {hi}], got {v}")
    return float(v)


def stops_of(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,)
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return tuple(v)
    raise BadRequest("stop must be a string or a list of strings")


def parse_native(params: Any) -> tuple[Sampling, tuple[str, ...]]:
    """SGLang sampling_params -> (Sampling, stop strings)."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be an object (batched requests are not supported by the simulator)")
    for key in params:
        if key not in NATIVE_KEYS:  # api_types.py::_unknown_field, serde's wording
            listed = ", ".join(f"`{f}`" for f in NATIVE_FIELDS)
            raise ContractError(f"unknown field `{key}`, expected one of {listed}")
    return build(params), stops_of(params.get("stop"))


def build(p: dict) -> Sampling:
    """Checked values -> Sampling; shared by the native and OpenAI routes (after renaming their keys)."""
    max_new = p.get("max_new_tokens", 128)
    if max_new is None:
        max_new = 128
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 0:
        raise BadRequest(f"max_new_tokens must be a non-negative integer, got {max_new!r}")
    n = p.get("n", 1)
    if n not in (None, 1):
        raise BadRequest("n > 1 is not supported by the simulator")
    temperature = _num(p, "temperature", 1.0, 0.0)
    top_p = _num(p, "top_p", 1.0, 0.0, 1.0)
    if top_p <= 0:
        raise BadRequest("top_p must be in (0, 1]")
    top_k = p.get("top_k", -1)
    if top_k is None:
        top_k = -1
    if isinstance(top_k, bool) or not isinstance(top_k, int) or (top_k < 1 and top_k != -1):
        raise BadRequest(f"top_k must be -1 (off) or >= 1, got {top_k!r}")
    ignore_eos = p.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest("ignore_eos must be a boolean")
    seed = p.get("sampling_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest("sampling_seed must be an integer")
    return Sampling(max_new, temperature, top_p, top_k, ignore_eos, seed)
