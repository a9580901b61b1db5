"""Secrets an engine echoes back: masked before anything reaches a manifest, a log copy or the screen.

SGLang 0.5.23's /server_info returns every resolved server argument in plain text, ``api_key``, ``admin_api_key``
and ``ssl_keyfile_password`` among them, and ``launch_command``, the command line as given, where only the
watermark configuration is redacted (srt/utils/common.py ``build_server_info``, srt/server_args.py
``resolved_dict`` and ``prepare_server_args``, srt/sampling/watermarking/core.py). A server rig did not launch may
carry secrets rig never saw, so they are masked by name, not only by the value rig knows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

MASK = "***"
SECRET_FIELDS = ("api_key", "admin_api_key", "ssl_keyfile_password")
SECRET_FLAGS = tuple("--" + f.replace("_", "-") for f in SECRET_FIELDS)
# A ${NAME} value shorter than this is no credible secret (a device index, a flag): masking every occurrence of it
# would shred the log and the command (each "0" in them); a secret flag's value is masked whatever its length.
MIN_SECRET_CHARS = 6
REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")  # ${NAME}: read from rig's environment at launch (env_refs.py)
API_KEY_PLACEHOLDER = "api_key"  # a command template's {api_key}: the run's key at launch (rig/server/command.py)


def _secret_args(argv: Sequence[str]) -> Iterator[tuple[int, str, str]]:
    """(index, prefix, value) of each secret flag's value: ``--api-key K`` gives the index of K and prefix "",
    ``--api-key=K`` the index of that argument and prefix "--api-key="."""
    for i, a in enumerate(argv):
        flag, eq, value = a.partition("=")
        if eq and flag in SECRET_FLAGS:
            yield i, flag + eq, value
        elif a in SECRET_FLAGS and i + 1 < len(argv):
            yield i + 1, "", argv[i + 1]


def mask_argv(argv: list[str]) -> list[str]:
    """The arguments with the value of every secret flag masked (``--api-key K`` and ``--api-key=K``)."""
    out = list(argv)
    for i, prefix, _ in _secret_args(argv):
        out[i] = prefix + MASK
    return out


def mask_command_line(text: str) -> str:
    """A command line as one string (words split on spaces) with every secret flag's value masked."""
    return " ".join(mask_argv(text.split(" ")))


def scrub_info(answer: Any) -> Any:
    """An info endpoint's JSON answer with SGLang's secret fields and the secrets in its launch command masked."""
    if not isinstance(answer, dict):
        return answer
    out = dict(answer)
    for name in SECRET_FIELDS:
        if out.get(name) not in (None, ""):
            out[name] = MASK
    if isinstance(out.get("launch_command"), str):
        out["launch_command"] = mask_command_line(out["launch_command"])
    states = out.get("internal_states")
    if isinstance(states, list):  # each DP rank's state repeats the server arguments
        out["internal_states"] = [scrub_info(s) for s in states]
    return out


def secret_values(argv: Sequence[str]) -> list[str]:
    """The values given to secret flags in these arguments."""
    return [value for _, _, value in _secret_args(argv) if value]


def escaped_forms(secret: str) -> list[str]:
    """The secret as text may carry it, longest first: as given, JSON-escaped (a JSON log line or document: ``"``,
    ``\\`` and control characters escaped, non-ASCII as ``\\uXXXX`` or left as is) and repr-escaped (Python's
    logging of its arguments: SGLang logs ``server_args=ServerArgs(...)``, its dataclass repr)."""
    forms = {
        secret,
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        repr(secret)[1:-1],
        json.dumps(repr(secret)[1:-1])[1:-1],  # a repr inside a JSON document (a log line shipped as JSON)
    }
    return sorted(forms, key=len, reverse=True)


def redact(obj: Any, secrets: Sequence[str]) -> Any:
    """A copy of obj (str, list, dict) with every occurrence of each secret, in each of its escaped forms, replaced
    by the mask."""
    forms = sorted({f for x in secrets if x for f in escaped_forms(x)}, key=len, reverse=True)
    return _redact(obj, forms) if forms else obj


def _redact(obj: Any, forms: Sequence[str]) -> Any:
    if isinstance(obj, str):
        for x in forms:
            obj = obj.replace(x, MASK)
        return obj
    if isinstance(obj, list):
        return [_redact(x, forms) for x in obj]
    if isinstance(obj, dict):
        return {k: _redact(v, forms) for k, v in obj.items()}
    return obj


def plain_secret_in_command(command: Sequence[str], own_values: Iterable[str] = ()) -> str | None:
    """Why this command template may not be kept as given (it is written into the manifest and every record), or
    None. A secret flag's value must be ``${NAME}`` (read from the environment at launch) or, for --api-key,
    ``{api_key}`` (the run's key); ``own_values``: the template's own placeholders (``command_vars``, what --grid
    sweeps), whose values are recorded as given, so they carry no secret either."""
    own = set(own_values)
    for i, prefix, value in _secret_args(command):
        flag = prefix.removesuffix("=") or command[i - 1]
        placeholder = value[1:-1] if value.startswith("{") and value.endswith("}") and "{" not in value[1:] else None
        if flag == "--api-key":
            if value != "{" + API_KEY_PLACEHOLDER + "}":
                return (
                    f"--api-key in server.command must be {{{API_KEY_PLACEHOLDER}}}: rig fills in the run's key "
                    f"(export RIG_API_KEY, or --api-key-env NAME) and sends it; a key typed in would be written "
                    f"into results"
                )
        elif placeholder in own:
            return (
                f"{flag} in server.command takes {{{placeholder}}}, whose value is recorded with every result: "
                f"write {flag}=${{NAME}} and export NAME"
            )
        elif value and placeholder is None and not REF.fullmatch(value):
            return (
                f"{flag} in server.command has its value in plain text, which would be written into results: "
                f"write {flag}=${{NAME}} and export NAME"
            )
    return None


def plain_secret(extra_args: Iterable[str]) -> str | None:
    """Why these extra engine arguments may not be kept as given (they would be written into the manifest and the
    records), or None: the API key goes through --api-key-env, any other secret flag's value through ${NAME}."""
    args = list(extra_args)
    if any(a.partition("=")[0] == "--api-key" for a in args):
        return "--api-key in server args: give the key with --api-key-env NAME (rig passes it to the server too)"
    for i, prefix, value in _secret_args(args):
        if value and not REF.fullmatch(value):
            flag = prefix.removesuffix("=") or args[i - 1]
            return f"{flag} has its value in plain text, which would be written into results: write {flag}=${{NAME}}"
    return None
