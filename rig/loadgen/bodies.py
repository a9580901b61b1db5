"""The JSON bodies the rig sends, and the speculative stats a server reports back: each API's fields, typed.

Plain dicts at runtime (TypedDict): a body is built per request and goes straight to ``orjson.dumps``. Which of the
optional fields a body carries is its dialect's call (rig.loadgen.dialects); the user's extra fields (--extra-body)
are added last, and may be any but ``RIG_FIELDS``.
"""

from __future__ import annotations

from typing import TypedDict


class NativeSampling(TypedDict, total=False):
    """``sampling_params`` of SGLang's native /generate."""

    max_new_tokens: int
    temperature: float
    top_p: float
    ignore_eos: bool
    top_k: int
    sampling_seed: int


class NativeBody(TypedDict):
    """SGLang's native /generate."""

    text: str
    sampling_params: NativeSampling
    stream: bool
    rid: str


class StreamOptions(TypedDict, total=False):
    include_usage: bool
    continuous_usage_stats: bool  # SGLang, vLLM: the running usage on every chunk


class OpenAIBody(TypedDict, total=False):
    """/v1/completions (``prompt``, ``return_token_ids``) and /v1/chat/completions (``messages``,
    ``max_completion_tokens``): OpenAI's fields, then the extensions SGLang and vLLM document."""

    model: str
    prompt: str
    messages: list[dict[str, str]]
    temperature: float
    top_p: float
    seed: int
    max_tokens: int
    max_completion_tokens: int
    stream: bool
    stream_options: StreamOptions
    ignore_eos: bool
    top_k: int
    min_p: float
    repetition_penalty: float
    return_token_ids: bool
    return_spec_tokens_details: bool


RequestBody = NativeBody | OpenAIBody


class SpecStats(TypedDict, total=False):
    """A server's per-request speculative stats, under the record's column names."""

    spec_verify_ct: int
    spec_accept_length: float
    spec_accepted_drafts: int
    spec_proposed_drafts: int


# Why a field may not come from --extra-body: rig sets it (or what it governs) itself, and records what it set. An
# extra field wins over rig's own (Dialect.finish), so it would make the record, and every figure read from it (TPOT at
# a fixed length, the greedy losslessness check, pairing), state a request that was not the one sent.
_WHY = {
    "sampling": "rig sends the workload's {key} and records it with every request (--workload-opt {key}=...)",
    "neutral": "rig sends min_p 0 and repetition_penalty 1, so that the server fills in nothing from the model's "
    "generation_config.json and the records' sampling is what ran",
    "length": "rig sends the workload's max_tokens and records it (--workload-opt max_tokens=N)",
    "seed": "rig sends per-request seeds drawn from --seed and records them",
    "request": "rig builds the request from the workload (its prompt, its sampling) and records it",
    "stream": "rig streams every request and reads its usage and token ids in the way it asks for them",
    "rid": "rig gives every attempt ids of its own (SGLang aborts a request under an id it just served)",
    "one output": "rig reads and records one output per request",
    "end": "where an output ends is the workload's (max_tokens, ignore_eos), and the record says which it was",
    "echo": "the prompt would come back as output and be counted as completion tokens",
}
_FIELD_WHY = {
    **dict.fromkeys(("temperature", "top_p", "top_k", "ignore_eos"), _WHY["sampling"]),
    **dict.fromkeys(("min_p", "repetition_penalty"), _WHY["neutral"]),
    **dict.fromkeys(("max_tokens", "max_completion_tokens", "max_new_tokens"), _WHY["length"]),
    **dict.fromkeys(("seed", "sampling_seed"), _WHY["seed"]),
    **dict.fromkeys(("model", "prompt", "messages", "text", "input_ids", "sampling_params"), _WHY["request"]),
    **dict.fromkeys(("stream", "stream_options", "return_token_ids", "return_spec_tokens_details"), _WHY["stream"]),
    **dict.fromkeys(("rid", "request_id"), _WHY["rid"]),  # vLLM's bodies take request_id
    **dict.fromkeys(("n", "best_of"), _WHY["one output"]),
    **dict.fromkeys(("stop", "stop_token_ids", "min_tokens", "min_new_tokens"), _WHY["end"]),
    "echo": _WHY["echo"],
}
_BODIES = (NativeBody, NativeSampling, OpenAIBody, StreamOptions)
# Every field a body of rig's may carry is covered (tests/unit/test_dialects.py holds the two together).
RIG_FIELDS = frozenset(_FIELD_WHY)
TYPED_FIELDS = frozenset(k for t in _BODIES for k in t.__annotations__ if k not in StreamOptions.__annotations__)


def rig_field_reason(key: str) -> str | None:
    """Why ``key`` may not be an extra body field (rig sets it, or what it governs, itself), or None."""
    why = _FIELD_WHY.get(key)
    return None if why is None else why.format(key=key)
