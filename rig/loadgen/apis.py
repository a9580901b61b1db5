"""Request payloads and streamed-event parsing for each HTTP API the rig speaks.

Each API turns a Turn (plus conversation history) into a path and JSON body, and folds each streamed JSON event
into a ``StreamState``. Which fields a body carries beyond OpenAI's own is its dialect's call (rig.loadgen.dialects).
Token counts come from the server (meta_info / usage / token ids); only a plain-OpenAI server that sends no usage has
its count estimated from the chunks (the record says so: ``completion_tokens_source``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from rig.loadgen.bodies import NativeBody, NativeSampling, OpenAIBody, RequestBody, SpecStats
from rig.loadgen.dialects import Dialect
from rig.loadgen.server_fields import server_timestamps as _server_timestamps
from rig.loadgen.server_fields import speculative_fields as _speculative_fields
from rig.loadgen.server_fields import vllm_speculative_fields as _vllm_speculative_fields
from rig.loadgen.wire_ids import wire_id
from rig.workloads.base import Turn, render_messages


class StreamError(Exception):
    """The server said something the rig cannot accept (error event, malformed event)."""


@dataclass
class StreamState:
    """What the stream has told us so far."""

    text_parts: list[str] = field(default_factory=list)
    # chat: the content pieces alone (text_parts also holds the reasoning of a server with a reasoning parser, for
    # the hash and length); the next turn resends only the content as the assistant's reply, as real clients do
    reply_parts: list[str] = field(default_factory=list)
    reasoning: bool = False  # a reasoning_content piece arrived
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    # usage: the server's own count (usage, meta_info); chunks: counted by the client (a plain-OpenAI server that
    # sent no usage), an estimate: a chunk may carry several tokens
    tokens_source: str = "usage"
    finished: bool = False  # a finish reason arrived
    done: bool = False  # [DONE] arrived
    speculative: SpecStats = field(default_factory=SpecStats)  # the server's per-request speculative stats
    server_ts: dict[str, float] = field(default_factory=dict)
    # OpenAI APIs: completion tokens already attributed to a chunk (continuous usage stats)
    _usage_tokens: int = 0
    # a chunk with text but neither token ids nor a running usage was counted as one token (SGLang 0.5.16's
    # completions, a plain server): the chunks' counts may then not sum to the server's completion_tokens
    counted_by_text: bool = False
    # native API: cumulative state
    _native_tokens: int = 0
    _native_text: str = ""

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def reply(self) -> str:
        """The assistant's reply as a client resends it in the next turn: without the reasoning text."""
        return "".join(self.reply_parts) if self.reasoning else self.text


def _finish_name(fr: Any) -> str | None:
    if fr is None:
        return None
    if isinstance(fr, dict):
        return str(fr.get("type"))
    return str(fr)


def _error_message(obj: dict[str, Any]) -> str | None:
    err = obj.get("error")
    if err is not None:
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err)
    if obj.get("object") == "error":
        return str(obj.get("message") or obj)
    return None


def _check_event(obj: Any) -> None:
    """A StreamError if the event is not an object or it carries the server's error."""
    if not isinstance(obj, dict):
        raise StreamError(f"malformed event: expected an object, got {type(obj).__name__}")
    msg = _error_message(obj)
    if msg is not None:
        raise StreamError(msg)


class Api:
    name = ""
    path = ""
    sends_rid = False  # whether the body names the request (SGLang's ``rid``)

    def __init__(self, dialect: Dialect | None = None, rid_tag: str = "") -> None:
        # Default: SGLang's dialect, what the sim and SGLang itself accept (rig.loadgen.dialects.ENGINE_DIALECTS).
        self.dialect, self.rid_tag = (dialect if dialect is not None else Dialect()), rid_tag

    def wire_id(self, turn: Turn) -> str | None:
        """The id this request goes out under, where the body names it (rig.loadgen.wire_ids)."""
        return wire_id(turn.request_id, self.rid_tag) if self.sends_rid else None

    def payload(self, turn: Turn, history: list[dict[str, str]], model: str) -> RequestBody:
        raise NotImplementedError

    def fold(self, obj: Any, state: StreamState) -> int:
        """Apply one event; return how many new output tokens (or, if unknown, non-empty pieces) it carried."""
        raise NotImplementedError

    def fold_all(self, objs: list[Any], state: StreamState, tokens: list[int]) -> None:
        """Apply the events of one read in order; each one's token count, if it carried any, goes on ``tokens``
        (an event that raises leaves the counts of the events before it in place)."""
        fold = self.fold
        for obj in objs:
            n = fold(obj, state)
            if n > 0:
                tokens.append(n)

    def fold_array(self, array: bytes, count: int, state: StreamState, tokens: list[int]) -> int:
        """Parse one read's ``count`` events, given as one JSON array text, and fold them as ``fold_all`` does.

        Returns how many it folded: all, or -- when the array is not ``count`` JSON values (a malformed event) --
        the ones before the first it could not vouch for; the caller parses the rest one by one."""
        try:
            objs = orjson.loads(array)
        except orjson.JSONDecodeError:
            return 0
        if len(objs) != count:  # e.g. one event held two objects
            return 0
        self.fold_all(objs, state, tokens)
        return count


class SGLangNative(Api):
    """SGLang's native /generate: cumulative text, meta_info with server token counts and speculative stats."""

    name = "sglang-native"
    path = "/generate"
    sends_rid = True

    def payload(self, turn: Turn, history: list[dict[str, str]], model: str) -> NativeBody:
        params: NativeSampling = {
            "max_new_tokens": turn.max_tokens,
            "temperature": turn.temperature,
            "top_p": turn.top_p,
            "ignore_eos": turn.ignore_eos,
        }
        if turn.top_k and turn.top_k > 0:
            params["top_k"] = turn.top_k
        if turn.seed is not None:
            params["sampling_seed"] = turn.seed
        body: NativeBody = {
            "text": render_messages([*history, *turn.messages]),
            "sampling_params": params,
            "stream": True,
            "rid": wire_id(turn.request_id, self.rid_tag),
        }
        return self.dialect.finish(body)

    def fold(self, obj: Any, state: StreamState) -> int:
        _check_event(obj)
        meta = obj.get("meta_info")
        text = obj.get("text")
        if not isinstance(meta, dict) or not isinstance(text, str):
            raise StreamError("malformed event: /generate chunk without text and meta_info")
        ct = meta.get("completion_tokens")
        if not isinstance(ct, int):
            raise StreamError("malformed event: meta_info.completion_tokens missing")
        new_tokens = ct - state._native_tokens
        if not text.startswith(state._native_text):
            # --incremental-streaming-output servers send deltas, not cumulative text.
            piece = text
            state._native_text += text
        else:
            piece = text[len(state._native_text) :]
            state._native_text = text
        state._native_tokens = ct
        if piece:
            state.text_parts.append(piece)
        state.completion_tokens = ct
        if isinstance(meta.get("prompt_tokens"), int):
            state.prompt_tokens = meta["prompt_tokens"]
        if isinstance(meta.get("cached_tokens"), int):
            state.cached_tokens = meta["cached_tokens"]
        fr = meta.get("finish_reason")
        if fr is not None:
            state.finish_reason = _finish_name(fr)
            state.finished = True
            if state.finish_reason == "abort":
                reason = fr.get("message") if isinstance(fr, dict) else None
                raise StreamError(f"server aborted the request: {reason or fr}")
            state.speculative.update(_speculative_fields(meta))
            state.server_ts.update(_server_timestamps(meta))
        return max(new_tokens, 0)


class _OpenAIBase(Api):
    def _common(self, turn: Turn, model: str) -> OpenAIBody:
        """The fields of OpenAI's API reference both routes share, plus the dialect's extensions."""
        d = self.dialect
        body: OpenAIBody = {
            "model": model,
            "temperature": turn.temperature,
            "top_p": turn.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},  # a final usage chunk (OpenAI's reference)
        }
        if d.ignore_eos:
            body["ignore_eos"] = turn.ignore_eos
        if d.spec_details:
            # Per-request speculative stats arrive under sglext.spec_tokens_details only when asked for
            # (SGLang 0.5.23 openai/serving_completions.py, serving_chat.py). Servers that validate their bodies
            # refuse it (transformers serve: 422), so only SGLang's dialect sends it.
            body["return_spec_tokens_details"] = True
        if d.top_k:
            # Every sampling parameter the records state, sent: a field left out is filled from the model's
            # generation_config.json -- SGLang's chat route (--sampling-defaults model, its default: openai/protocol.py
            # ChatCompletionRequest.to_sampling_params), vLLM's chat and completions (--generation-config auto) -- so
            # top_k -1 (off), min_p 0 and repetition_penalty 1 go out explicitly (both accept -1 as off). Plain
            # OpenAI has none of these fields (the run warns what it cannot send).
            body["top_k"] = turn.top_k if turn.top_k and turn.top_k > 0 else -1
            body["min_p"] = 0.0
            body["repetition_penalty"] = 1.0
        if turn.seed is not None:
            body["seed"] = turn.seed
        return body

    def _piece(self, choice: dict[str, Any]) -> str:
        raise NotImplementedError

    def fold(self, obj: Any, state: StreamState) -> int:
        # The common event, one choice and nothing else to look at: straight to it.
        if (
            type(obj) is dict
            and obj.get("usage") is None
            and obj.get("error") is None
            and obj.get("sglext") is None
            and obj.get("metrics") is None
            and obj.get("object") != "error"
        ):
            choices = obj.get("choices")
            if type(choices) is list and choices and type(choices[0]) is dict:
                return self._fold_choice(choices[0], None, state)
        _check_event(obj)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            _take_usage(usage, state)
        ext = obj.get("sglext")
        if isinstance(ext, dict) and isinstance(ext.get("spec_tokens_details"), dict):
            state.speculative.update(_speculative_fields(ext["spec_tokens_details"]))
        metrics = obj.get("metrics")
        if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
            state.speculative.update(_vllm_speculative_fields(metrics["speculative_decoding"]))
        choices = obj.get("choices")
        if choices is None:
            if usage is None and ext is None:
                raise StreamError("malformed event: no choices, usage or error")
            return 0
        if not isinstance(choices, list):
            raise StreamError("malformed event: choices is not a list")
        if not choices:
            return 0
        choice = choices[0]
        if not isinstance(choice, dict):
            raise StreamError("malformed event: choice is not an object")
        return self._fold_choice(choice, usage, state)

    def _fold_choice(self, choice: dict[str, Any], usage: Any, state: StreamState) -> int:
        piece = self._piece(choice)
        ids = choice.get("token_ids")
        ct = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if isinstance(ids, list):
            n = len(ids)
        elif piece and isinstance(ct, int):
            # Continuous usage stats: the server's running count; tokens of chunks without text (none is sent in
            # SGLang's chat) go to the next chunk with text, so the per-chunk counts sum to the server's total. A
            # step's reasoning and content chunks carry the same count (serving_chat.py::_generate_stream_content):
            # the second one brings no new token.
            n = ct - state._usage_tokens if ct > state._usage_tokens else 0
            state._usage_tokens = max(state._usage_tokens, ct)
        else:
            n = 1 if piece else 0
            state.counted_by_text = state.counted_by_text or bool(piece)
        if piece:
            state.text_parts.append(piece)
        if choice.get("finish_reason") is not None:
            state.finish_reason = _finish_name(choice["finish_reason"])
            state.finished = True
            if state.finish_reason == "abort":
                raise StreamError("server aborted the request")
        return n


def _take_usage(usage: dict[str, Any], state: StreamState) -> None:
    """An event's usage into the state: the prompt, completion (running, with continuous usage stats) and cached
    token counts."""
    if isinstance(usage.get("prompt_tokens"), int):
        state.prompt_tokens = usage["prompt_tokens"]
    if isinstance(usage.get("completion_tokens"), int):
        state.completion_tokens = usage["completion_tokens"]
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        state.cached_tokens = details["cached_tokens"]


def _typed_tokens(ids: Any, text: str, usage: dict[str, Any] | None, state: StreamState) -> int:
    """A typed completions event's token count, as fold() counts it: its token ids, else the growth of the running
    usage (continuous usage stats), else one per chunk with text (said in ``counted_by_text``)."""
    if usage is not None:
        _take_usage(usage, state)
    if type(ids) is list:
        return len(ids)
    ct = usage.get("completion_tokens") if usage is not None else None
    if text and type(ct) is int:
        n = ct - state._usage_tokens if ct > state._usage_tokens else 0
        state._usage_tokens = max(state._usage_tokens, ct)
        return n
    state.counted_by_text = state.counted_by_text or bool(text)
    return 1 if text else 0


class _Choice(msgspec.Struct, gc=False):
    """What the fold reads of a completions choice; the decoder skips every other field without making objects."""

    text: Any = None
    token_ids: Any = None
    finish_reason: Any = None


class _Event(msgspec.Struct, gc=False):
    """What the fold reads of a completions event: its choices, and whatever would send it to the full fold."""

    choices: list[_Choice] | None = None
    usage: Any = None
    error: Any = None
    sglext: Any = None
    metrics: Any = None
    kind: Any = msgspec.field(name="object", default=None)


_EVENTS = msgspec.json.Decoder(list[_Event])
_FEW = 8  # events left after the typed fold stopped: found from the array's end (more: the whole array parsed)


class OpenAICompletions(_OpenAIBase):
    name = "openai-completions"
    path = "/v1/completions"

    def fold_array(self, array: bytes, count: int, state: StreamState, tokens: list[int]) -> int:
        # The generator's hot path. Decoded into typed events (only the fields the fold reads become objects), the
        # common event -- one choice, no usage, error, extension or metrics -- is folded inline exactly as fold()
        # folds it. From the first other event on (the usage event that ends a stream) the rest are folded as dicts.
        try:
            events = _EVENTS.decode(array)
        except msgspec.MsgspecError:  # not JSON, or not events of this shape: the dicts tell fold() what is wrong
            return super().fold_array(array, count, state, tokens)
        if len(events) != count:
            return 0
        parts = state.text_parts
        i = 0
        for e in events:
            usage = e.usage
            if (
                (usage is not None and type(usage) is not dict)
                or e.error is not None
                or e.sglext is not None
                or e.metrics is not None
                or e.kind == "error"
                or not e.choices
            ):
                break
            choice = e.choices[0]
            text = choice.text
            if text is None:
                text = ""
            elif type(text) is not str:
                break  # fold() says what is wrong with it
            ids = choice.token_ids
            n = len(ids) if type(ids) is list and usage is None else _typed_tokens(ids, text, usage, state)
            if text:
                parts.append(text)
            if choice.finish_reason is not None:
                state.finish_reason = _finish_name(choice.finish_reason)
                state.finished = True
                if state.finish_reason == "abort":
                    raise StreamError("server aborted the request")
            if n > 0:
                tokens.append(n)
            i += 1
        if i == count:
            return count
        try:
            if count - i > _FEW:
                objs = orjson.loads(array)[i:]
            else:  # the separator before event i (when i is 0, none: rfind gives -1, and the array's "[" is cut)
                pos = len(array)
                for _ in range(count - i):
                    pos = array.rfind(b",\n", 0, pos)
                objs = orjson.loads(b"[" + array[pos + 2 :])
        except orjson.JSONDecodeError:
            return i
        self.fold_all(objs, state, tokens)
        return count

    def payload(self, turn: Turn, history: list[dict[str, str]], model: str) -> OpenAIBody:
        body = self._common(turn, model)
        body["prompt"] = render_messages([*history, *turn.messages])
        body["max_tokens"] = turn.max_tokens
        if self.dialect.continuous_usage:
            # The running completion-token count on every chunk: the chunk counts where a server has no
            # return_token_ids (SGLang 0.5.16's CompletionRequest lacks it and ignores unknown fields);
            # serving_completions.py honours stream_options.continuous_usage_stats as serving_chat.py does.
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        if self.dialect.token_ids:
            # Each streamed choice then carries its new token ids (several per chunk under speculative decoding):
            # the per-chunk token counts behind ITL (openai/serving_completions.py::_generate_completion_stream).
            body["return_token_ids"] = True
        return self.dialect.finish(body)

    def _piece(self, choice: dict[str, Any]) -> str:
        text = choice.get("text")
        if text is not None and not isinstance(text, str):
            raise StreamError("malformed event: choices[0].text is not a string")
        return text or ""


class OpenAIChat(_OpenAIBase):
    name = "openai-chat"
    path = "/v1/chat/completions"

    def payload(self, turn: Turn, history: list[dict[str, str]], model: str) -> OpenAIBody:
        # No return_token_ids here: SGLang's chat route answers 400 to it with stream=true
        # (openai/serving_chat.py::_convert_to_internal_request). Continuous usage stats put the running
        # completion-token count on every content chunk instead (serving_chat.py; vLLM does the same), which gives
        # the tokens per chunk under speculative decoding.
        body = self._common(turn, model)
        if self.dialect.continuous_usage:
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        body["messages"] = [*history, *turn.messages]
        # Both are in OpenAI's reference (max_tokens deprecated there); servers honour one or the other
        # (transformers serve 5.19 ignores max_completion_tokens: cli/serving/chat_completion.py).
        body["max_tokens"] = turn.max_tokens
        body["max_completion_tokens"] = turn.max_tokens
        return self.dialect.finish(body)

    def _piece(self, choice: dict[str, Any]) -> str:
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise StreamError("malformed event: delta is not an object")
        content = delta.get("content") or ""
        reasoning = delta.get("reasoning_content") or ""
        if not isinstance(content, str) or not isinstance(reasoning, str):
            raise StreamError("malformed event: delta content is not a string")
        return reasoning + content

    def _fold_choice(self, choice: dict[str, Any], usage: Any, state: StreamState) -> int:
        n = super()._fold_choice(choice, usage, state)
        delta = choice.get("delta")  # vetted by _piece
        if delta:
            if delta.get("content"):
                state.reply_parts.append(delta["content"])
            if delta.get("reasoning_content"):
                state.reasoning = True
        return n


APIS: dict[str, Api] = {a.name: a for a in (SGLangNative(), OpenAICompletions(), OpenAIChat())}


def api_for(name: str, dialect: Dialect | None = None, rid_tag: str = "") -> Api:
    """The API ``name`` speaking ``dialect`` (default: SGLang's), its request ids tagged with ``rid_tag``."""
    try:
        cls = type(APIS[name])
    except KeyError:
        raise ValueError(f"unknown api {name!r}; choose one of {', '.join(APIS)}") from None
    return cls(dialect, rid_tag)
