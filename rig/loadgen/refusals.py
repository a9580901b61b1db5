"""A 4xx that names the request fields a server refused becomes one line naming them and the option that fixes it.

The shapes servers answer with:
- FastAPI ``HTTPException``: 422 ``{"detail": "Unexpected fields in the request: {'ignore_eos', ...}"}``
  (transformers serve 5.x, cli/serving/utils.py ``BaseHandler._validate_request``);
- OpenAI's API: 400 ``{"error": {"message": "Unrecognized request argument supplied: ignore_eos", ...}}``, and on
  newer routes ``"Unknown parameter: 'stream_options.continuous_usage_stats'."`` with ``code: unknown_parameter``;
- pydantic models with ``extra="forbid"`` behind FastAPI: 422 ``{"detail": [{"type": "extra_forbidden",
  "loc": ["body", "ignore_eos"], ...}]}`` (also seen quoted inside an error message as Python reprs).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from rig.loadgen.dialects import OPENAI_FIELDS, OPENAI_STREAM_OPTIONS, Dialect

_UNEXPECTED = re.compile(r"Unexpected fields in the request: \{([^}]*)\}")
_UNRECOGNIZED = re.compile(r"Unrecognized request arguments? supplied: ([\w.]+(?:\s*,\s*[\w.]+)*)")
_UNKNOWN_PARAM = re.compile(r"Unknown parameter: '([\w.\[\]]+)'")
_FORBIDDEN_REPR = re.compile(r"'type': 'extra_forbidden', 'loc': \(([^)]*)\)")
_QUOTED = re.compile(r"'([^']+)'")


def refused_fields(status: int | None, text: str) -> list[str]:
    """The request fields a 4xx answer's body says the server refused (empty when it names none)."""
    if status is None or not 400 <= status < 500:
        return []
    found: list[str] = []
    m = _UNEXPECTED.search(text)
    if m:
        found += _QUOTED.findall(m.group(1))
    for m in _UNRECOGNIZED.finditer(text):
        found += [f.strip() for f in m.group(1).split(",")]
    found += _UNKNOWN_PARAM.findall(text)
    found += _forbidden_locs(text)
    for m in _FORBIDDEN_REPR.finditer(text):
        parts = _QUOTED.findall(m.group(1))
        if parts:
            found.append(_loc_name(parts))
    return sorted(dict.fromkeys(f for f in found if f))


def _forbidden_locs(text: str) -> list[str]:
    """pydantic's error list as FastAPI answers it (``detail``), extra_forbidden entries only."""
    try:
        body: Any = orjson.loads(text)
    except orjson.JSONDecodeError:
        return []
    detail = body.get("detail") if isinstance(body, dict) else None
    if not isinstance(detail, list):
        return []
    out = []
    for d in detail:
        if isinstance(d, dict) and d.get("type") == "extra_forbidden" and isinstance(d.get("loc"), list):
            out.append(_loc_name([str(x) for x in d["loc"]]))
    return out


def _loc_name(loc: list[str]) -> str:
    """["body", "stream_options", "continuous_usage_stats"] -> "stream_options.continuous_usage_stats"."""
    parts = loc[1:] if loc and loc[0] == "body" else loc
    return ".".join(parts)


def refusal_line(fields: list[str], dialect: Dialect, path: str) -> str:
    """One line: the refused fields, and which option drops them."""
    standard = OPENAI_FIELDS.get(path, frozenset())

    def in_reference(f: str) -> bool:
        top, _, sub = f.partition(".")
        return top in standard and (top != "stream_options" or not sub or sub in OPENAI_STREAM_OPTIONS)

    extra = [f for f in fields if f.split(".")[0] in dialect.extra_body]
    own = [f for f in fields if f not in extra and not in_reference(f)]
    openai = [f for f in fields if f not in extra and in_reference(f)]
    fixes = []
    if own and dialect.name != "plain":
        how = (
            "run with --dialect plain (or drop --dialect " + dialect.name + ")"
            if dialect.source == "user"
            else f"run with --dialect plain (rig chose {dialect.name} by {dialect.source})"
        )
        fixes.append(f"it speaks plain OpenAI; {how}")
    elif own:  # plain sends none of these: a server that refuses what rig did not send is odd; say what was seen
        fixes.append("rig's plain dialect sent them nonetheless: please report it")
    if extra:
        fixes.append("drop --extra-body " + ", ".join(f.split(".")[0] for f in extra))
    if openai:
        fixes.append(
            f"{', '.join(openai)} {'is' if len(openai) == 1 else 'are'} in OpenAI's API reference and "
            f"every dialect sends {'it' if len(openai) == 1 else 'them'}: try the other OpenAI route "
            f"(--api openai-chat / openai-completions)"
        )
    return f"server refused field{'s' if len(fields) > 1 else ''} {', '.join(fields)}: {'; '.join(fixes)}"


def http_error(status: int | None, text: str, dialect: Dialect, path: str) -> str:
    """A non-200 answer as a record's error: the refusal line where the body names refused fields, else the body."""
    fields = refused_fields(status, text)
    if fields:
        return f"HTTP {status}: {refusal_line(fields, dialect, path)}"[:300]
    return f"HTTP {status}: {text[:300]}"
