"""The JSON bodies the rig sends, and the speculative stats a server reports back: each API's fields, typed.

Plain dicts at runtime (TypedDict): a body is built per request and goes straight to ``orjson.dumps``. Which of the
optional fields a body carries is its dialect's call (rig.loadgen.dialects); the user's extra fields (--extra-body)
are added last, and may be any but ``RIG_FIELDS``.
"""

from __future__ import annotations

from typing import TypedDict

from rig.contracts.request_fields import RIG_FIELDS  # noqa: F401  (tests read it here, beside TYPED_FIELDS)


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


_BODIES = (NativeBody, NativeSampling, OpenAIBody, StreamOptions)
# Every field a body of rig's may carry is covered (tests/unit/test_dialects.py holds the two together).
TYPED_FIELDS = frozenset(k for t in _BODIES for k in t.__annotations__ if k not in StreamOptions.__annotations__)
