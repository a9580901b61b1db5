"""Request dialects: which body fields a request may carry, by what the server accepts.

``plain`` is OpenAI's own API: only the fields of its API reference for /v1/completions and /v1/chat/completions
(``OPENAI_FIELDS``). ``sglang`` and ``vllm`` add the extension fields those engines document (``ignore_eos``,
``top_k``, per-chunk token ids, continuous usage stats, SGLang's speculative details). Servers that validate their
bodies refuse anything else: OpenAI answers 400 "Unrecognized request argument supplied", ``transformers serve``
422 "Unexpected fields in the request" (transformers/cli/serving/utils.py ``BaseHandler._validate_request``).

A dialect is decided once per server configuration (rig.run.lifecycle, from ``identify`` over what the server
actor's describe() fetched) and travels to the load generators inside their plan; the payload builders of
rig.loadgen.apis ask it which extensions to add, then add the user's extra body fields last.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar, cast

from rig.contracts.dialect import ENGINE_DIALECTS, DialectName
from rig.loadgen.bodies import NativeBody, OpenAIBody

_Body = TypeVar("_Body", NativeBody, OpenAIBody)


class DialectManifest(TypedDict):
    """What the manifest records of a server configuration's dialect."""

    dialect: DialectName
    dialect_source: str
    extra_body: dict[str, Any]


# The request fields of OpenAI's API reference (platform.openai.com/docs/api-reference/completions/create and
# .../chat/create), as the official SDK declares them: openai-python 3.57 types/completion_create_params.py and
# types/chat/completion_create_params.py (CompletionCreateParamsBase plus ``stream``). ``stream_options`` holds
# ``include_usage`` and ``include_obfuscation`` (types/chat/chat_completion_stream_options_param.py).
OPENAI_FIELDS: dict[str, frozenset[str]] = {
    "/v1/completions": frozenset(
        {
            "model",
            "prompt",
            "best_of",
            "echo",
            "frequency_penalty",
            "logit_bias",
            "logprobs",
            "max_tokens",
            "n",
            "presence_penalty",
            "seed",
            "stop",
            "stream",
            "stream_options",
            "suffix",
            "temperature",
            "top_p",
            "user",
        }
    ),
    "/v1/chat/completions": frozenset(
        {
            "messages",
            "model",
            "audio",
            "frequency_penalty",
            "function_call",
            "functions",
            "logit_bias",
            "logprobs",
            "max_completion_tokens",
            "max_tokens",
            "metadata",
            "modalities",
            "moderation",
            "n",
            "parallel_tool_calls",
            "prediction",
            "presence_penalty",
            "prompt_cache_key",
            "prompt_cache_options",
            "prompt_cache_retention",
            "reasoning_effort",
            "response_format",
            "safety_identifier",
            "seed",
            "service_tier",
            "stop",
            "store",
            "stream",
            "stream_options",
            "temperature",
            "tool_choice",
            "tools",
            "top_logprobs",
            "top_p",
            "user",
            "verbosity",
            "web_search_options",
        }
    ),
}
OPENAI_STREAM_OPTIONS = frozenset({"include_usage", "include_obfuscation"})


@dataclass(frozen=True)
class Dialect:
    """What a request to one server may carry. ``source``: how it was decided -- ``engine`` (the engine's own),
    ``probe:<path>`` (the server answered that path as only that engine does), ``user`` (--dialect), or
    ``default`` (a server no probe identified: plain OpenAI)."""

    name: DialectName = "sglang"
    extra_body: dict[str, Any] = field(default_factory=dict)  # added to every body last (--extra-body)
    source: str = "engine"

    @property
    def ignore_eos(self) -> bool:
        """Can a request ask for a fixed output length (generation past EOS)? Not in OpenAI's API."""
        return self.name != "plain"

    @property
    def top_k(self) -> bool:
        return self.name != "plain"

    @property
    def token_ids(self) -> bool:
        """Completions: each streamed choice carries its new token ids (``return_token_ids``: SGLang 0.5.23
        openai/protocol.py CompletionRequest; vLLM 0.32 entrypoints/openai/completion/protocol.py)."""
        return self.name != "plain"

    @property
    def continuous_usage(self) -> bool:
        """Chat: the running usage on every chunk (``stream_options.continuous_usage_stats``, SGLang and vLLM)."""
        return self.name != "plain"

    @property
    def spec_details(self) -> bool:
        """Per-request speculative stats under ``sglext`` (SGLang 0.5.23 openai/serving_completions.py)."""
        return self.name == "sglang"

    @property
    def counts_chunks(self) -> bool:
        """May a missing usage be estimated from counted chunks? Only where the dialect promises no usage: SGLang
        and vLLM always send it, so a stream without it is a fault there."""
        return self.name == "plain"

    def finish(self, body: _Body) -> _Body:
        """The body with the user's extra fields added (they win over rig's own; any field, so untyped)."""
        if self.extra_body:
            cast("dict[str, Any]", body).update(self.extra_body)
        return body

    def manifest(self) -> DialectManifest:
        """What the manifest records of it."""
        return {"dialect": self.name, "dialect_source": self.source, "extra_body": dict(self.extra_body)}


def identify(info: dict[str, Any]) -> tuple[DialectName, str] | None:
    """The dialect a server speaks from the answers of its info endpoints (path -> JSON, as the server actor's
    describe() records them), or None when none identifies it.

    - SGLang: GET /model_info (and /get_model_info, its deprecated alias) answers an object with ``model_path`` and
      ``is_generation`` (sglang 0.5.23 srt/entrypoints/http_server.py ``model_info``); no other engine rig knows
      has that route.
    - vLLM: GET /version answers exactly ``{"version": "<x.y.z>"}`` (vLLM 0.32
      entrypoints/serve/instrumentator/basic.py ``show_version``; entrypoints/openai/api_server.py before 0.11).
    """
    for path in ("/model_info", "/get_model_info"):
        ans = info.get(path)
        if isinstance(ans, dict) and "model_path" in ans and "is_generation" in ans:
            return "sglang", f"probe:{path}"
    ans = info.get("/version")
    if isinstance(ans, dict) and set(ans) == {"version"} and isinstance(ans["version"], str):
        return "vllm", "probe:/version"
    return None


def limits(dialect: Dialect, sampling: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
    """What the workloads ask for (name, WorkloadSpec.sampling()) that this dialect cannot send, one line each:
    said before the points run (the server configuration's warnings), never dropped in silence."""
    out = []
    for name, s in sampling:
        if s.get("ignore_eos") and not dialect.ignore_eos:
            out.append(
                f"workload {name} asks for a fixed output length (ignore_eos), which the {dialect.name} "
                f"dialect cannot send: its requests end at the model's EOS (counted: flag ended_early)"
            )
        if (s.get("top_k") or 0) > 0 and not dialect.top_k:
            out.append(
                f"workload {name} sets top_k={s['top_k']}, which the {dialect.name} dialect cannot send: the "
                f"server samples with its own top_k (the records keep the workload's value)"
            )
    return out


def resolve(engine: str, asked: DialectName | None, extra_body: dict[str, Any], info: dict[str, Any]) -> Dialect:
    """The dialect of one server configuration: the user's, else the engine's own (sim, sglang, vllm), else what a
    probe found, else plain OpenAI."""
    if asked is not None:
        return Dialect(asked, dict(extra_body), "user")
    if engine in ENGINE_DIALECTS:
        return Dialect(ENGINE_DIALECTS[engine], dict(extra_body), "engine")
    found = identify(info)
    if found is not None:
        return Dialect(found[0], dict(extra_body), found[1])
    return Dialect("plain", dict(extra_body), "default")
