"""Readers for user dataset files: ShareGPT JSON and JSONL (or a JSON list of JSONL-style records).

JSONL: one object per line with ``prompt`` (a non-empty string) or ``messages`` (a non-empty list of
``{"role": system|user|assistant|tool, "content": str}`` with at least one user message), not both; optional
``max_tokens`` (integer, 1 to 1,000,000) and ``timestamp`` (seconds, number >= 0). Other keys are ignored. Blank
lines are skipped. Timestamps must be on every entry or on none, and must not decrease (equal is fine): a decreasing
timestamp is an error rather than something we sort silently, because sorting would reorder request ids against the
file.

ShareGPT: a JSON list of ``{"conversations": [{"from": "human"|"gpt"|"system", "value": str}, ...]}``. The first
human turn is the prompt (with any system turns before it as the system message); the gpt reply after it gives a
max_tokens hint when asked. Entries with no human turn (empty conversations are common in public dumps) are skipped;
a file with no usable entry is an error. Entries without ``conversations`` are read as JSONL-style records.

Format ``auto``: ``.jsonl`` is JSONL, ``.json`` is JSON, anything else is JSON if it starts with ``[``.
Every problem is a one-line WorkloadError: ``<file>:<line>: what`` for JSONL, ``<file>: entry [i]: what`` for JSON.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from rig.workloads.errors import WorkloadError
from rig.workloads.lengths import MAX_TOKENS_LIMIT, estimate_tokens

_ROLES = {"system", "user", "assistant", "tool"}
# ShareGPT dumps use several speaker names; map them onto chat roles.
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "system": "system",
}


@dataclass(frozen=True)
class Entry:
    """One request read from a dataset file."""

    messages: tuple[dict[str, str], ...]
    max_tokens: int | None  # from the file (or the ShareGPT reply-length hint); None: use the spec's fallback
    timestamp: float | None
    where: str  # "file:line" or "file: entry [i]", for metadata and error messages


def _short(value: Any) -> str:
    """A value for an error message: repr'd (so no raw newlines) and cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _record(obj: Any, where: str) -> Entry:
    """A JSONL-style object -> Entry, or a WorkloadError naming ``where``."""
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    has_prompt, has_messages = "prompt" in obj, "messages" in obj
    if has_prompt and has_messages:
        raise WorkloadError(f"{where}: has both 'prompt' and 'messages'; give one")
    if not has_prompt and not has_messages:
        raise WorkloadError(f"{where}: missing 'prompt' (a string) or 'messages' (a list of {{role, content}})")
    if has_prompt:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise WorkloadError(f"{where}: 'prompt' must be a non-empty string (got {_short(prompt)})")
        messages: tuple[dict[str, str], ...] = ({"role": "user", "content": prompt},)
    else:
        messages = _messages(obj["messages"], where)
    return Entry(messages, _max_tokens(obj.get("max_tokens"), where), _timestamp(obj.get("timestamp"), where), where)


def _messages(raw: Any, where: str) -> tuple[dict[str, str], ...]:
    if not isinstance(raw, list) or not raw:
        raise WorkloadError(f"{where}: 'messages' must be a non-empty list (got {_short(raw)})")
    out = []
    for k, m in enumerate(raw):
        if not isinstance(m, dict):
            raise WorkloadError(f"{where}: messages[{k}] must be an object with 'role' and 'content'")
        role, content = m.get("role"), m.get("content")
        if role not in _ROLES:
            raise WorkloadError(
                f"{where}: messages[{k}].role must be one of {', '.join(sorted(_ROLES))} (got {_short(role)})"
            )
        if not isinstance(content, str):
            raise WorkloadError(f"{where}: messages[{k}].content must be a string (got {_short(content)})")
        out.append({"role": role, "content": content})
    if not any(m["role"] == "user" for m in out):
        raise WorkloadError(f"{where}: 'messages' has no user message")
    return tuple(out)


def _max_tokens(v: Any, where: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v > MAX_TOKENS_LIMIT:
        raise WorkloadError(
            f"{where}: 'max_tokens' must be an integer from 1 to {MAX_TOKENS_LIMIT:,} (got {_short(v)})"
        )
    return v


def _timestamp(v: Any, where: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise WorkloadError(f"{where}: 'timestamp' must be a number of seconds >= 0 (got {_short(v)})")
    return float(v)


def _check_timestamps(entries: list[Entry]) -> None:
    """All or none carry a timestamp, and they never decrease."""
    if not entries:
        return
    first_has = entries[0].timestamp is not None
    prev: Entry | None = None
    for e in entries:
        if (e.timestamp is not None) != first_has:
            state = (
                "has no 'timestamp' but the first entry does"
                if first_has
                else "has a 'timestamp' but the first entry does not"
            )
            raise WorkloadError(f"{e.where}: {state} (give timestamps on every entry or on none)")
        if prev is not None and e.timestamp is not None and prev.timestamp is not None and e.timestamp < prev.timestamp:
            raise WorkloadError(
                f"{e.where}: timestamp {e.timestamp:g} is earlier than the previous entry's "
                f"{prev.timestamp:g}; sort the file by timestamp"
            )
        prev = e


def _json_msg(e: json.JSONDecodeError) -> str:
    """The decoder's message without its dangling position words ("Unterminated string starting at")."""
    return e.msg.removesuffix(" starting at")


def _read_jsonl(path: str, text: str) -> list[Entry]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{path}:{n}: not valid JSON at column {e.colno}: {_json_msg(e)}") from None
        out.append(_record(obj, f"{path}:{n}"))
    return out


def _sharegpt(obj: dict[str, Any], where: str, use_reply_length: bool, cpt: float) -> Entry | None:
    """A ShareGPT entry -> Entry (first human turn), or None when it has no human turn."""
    conv = obj["conversations"]
    if not isinstance(conv, list):
        raise WorkloadError(f"{where}: 'conversations' must be a list (got {_short(conv)})")
    system: list[str] = []
    for k, turn in enumerate(conv):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise WorkloadError(f"{where}: conversations[{k}] must be an object with a string 'value'")
        role = _SHAREGPT_ROLES.get(str(turn.get("from", "")).lower())
        if role is None:
            raise WorkloadError(
                f"{where}: conversations[{k}].from must be human, gpt or system (got {_short(turn.get('from'))})"
            )
        if role == "system":
            system.append(turn["value"])
        elif role == "user":
            if not turn["value"].strip():
                return None
            messages = ([{"role": "system", "content": "\n".join(system)}] if system else []) + [
                {"role": "user", "content": turn["value"]}
            ]
            hint = None
            reply = conv[k + 1] if k + 1 < len(conv) else None
            if (
                use_reply_length
                and isinstance(reply, dict)
                and isinstance(reply.get("value"), str)
                and _SHAREGPT_ROLES.get(str(reply.get("from", "")).lower()) == "assistant"
                and reply["value"]
            ):
                hint = estimate_tokens(reply["value"], cpt)
            return Entry(tuple(messages), hint, None, where)
        else:
            return None  # an assistant speaking first: no prompt to send
    return None


def _read_json(path: str, text: str, fmt: str, use_reply_length: bool, cpt: float) -> list[Entry]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise WorkloadError(f"{path}:{e.lineno}: not valid JSON at column {e.colno}: {_json_msg(e)}") from None
    if not isinstance(data, list):
        raise WorkloadError(f"{path}: top level must be a JSON list of entries (got {type(data).__name__})")
    out = []
    skipped = 0
    for i, obj in enumerate(data):
        where = f"{path}: entry [{i}]"
        if isinstance(obj, dict) and "conversations" in obj:
            entry = _sharegpt(obj, where, use_reply_length, cpt)
            if entry is not None:
                out.append(entry)
            else:
                skipped += 1
        elif fmt == "sharegpt":
            raise WorkloadError(f"{where}: missing 'conversations' (ShareGPT format)")
        else:
            out.append(_record(obj, where))
    SKIPPED[os.path.abspath(path)] = skipped
    return out


SKIPPED: dict[str, int] = {}  # ShareGPT entries without a human turn, per file read (said at run start)


def skipped_entries(path: str) -> int:
    """How many entries of the (already read) file were skipped for having no human turn."""
    return SKIPPED.get(os.path.abspath(path), 0)


def read_dataset(
    path: str, fmt: str = "auto", *, use_reply_length: bool = False, chars_per_token: float = 4.5
) -> tuple[Entry, ...]:
    """Every usable entry of a dataset file, in file order (cached while the file is unchanged)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read ({e.strerror})") from None
    return _read_cached(os.path.abspath(path), path, st.st_mtime_ns, st.st_size, fmt, use_reply_length, chars_per_token)


@lru_cache(maxsize=8)
def _read_cached(
    _abs: str, path: str, _mtime: int, _size: int, fmt: str, use_reply_length: bool, cpt: float
) -> tuple[Entry, ...]:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except UnicodeDecodeError as e:
        raise WorkloadError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read ({e.strerror})") from None
    if fmt == "auto":
        # By suffix; otherwise sniff: a JSON list starts with '['.
        if path.endswith(".jsonl"):
            fmt = "jsonl"
        elif path.endswith(".json") or text.lstrip().startswith("["):
            fmt = "json"
        else:
            fmt = "jsonl"
    entries = _read_jsonl(path, text) if fmt == "jsonl" else _read_json(path, text, fmt, use_reply_length, cpt)
    if not entries:
        raise WorkloadError(f"{path}: no usable entries (need at least one prompt)")
    _check_timestamps(entries)
    return tuple(entries)
