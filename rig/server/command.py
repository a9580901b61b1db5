"""The command engine's template: an argument list whose ``{placeholders}`` are filled from one server configuration.

A placeholder names a setting of the configuration (``{model}``, ``{tp}``, ``{steps}``, ``{num_draft_tokens}``,
``{served_model_name}``, any other scalar ServerConfig field), the launch (``{host}``, ``{port}``), a value of
``command_vars`` (what ``--grid NAME=...`` sweeps), ``{extra_args}`` (an argument of its own that becomes the extra
args list) or ``{api_key}`` (the run's API key at launch; ``***`` wherever the command is shown or recorded).
``{{`` and ``}}`` are literal braces (a JSON argument). ``${NAME}`` is no placeholder: it stays as written here, and
the server actor alone fills it from rig's environment at launch (rig/server/env_refs.py), for a secret the server
takes on its command line. The arguments are never given to a shell.
"""

from __future__ import annotations

from string import Formatter
from typing import Any

from rig.server.redaction import API_KEY_PLACEHOLDER, REF
from rig.server.spec import ServerConfig

MASK = "***"  # what {api_key} shows as outside the launch itself
EXTRA_ARGS = "extra_args"
API_KEY = API_KEY_PLACEHOLDER
PORT = "port"
LAUNCH = ("host", "port")  # filled from the launch, not from the configuration's fields
# Fields that are not settings of the server's command line (or are not scalars to put in one).
_NOT_PLACEHOLDERS = {"command", "command_vars", "env", EXTRA_ARGS}
SPECULATIVE = ("steps", "num_draft_tokens")  # placeholders that carry a point's speculative setting


class TemplateError(ValueError):
    """A command template rig cannot expand; the message is one line."""


def _format_string(arg: str) -> str:
    """The argument as a format string: each ``${NAME}`` kept literally (its braces doubled)."""
    return REF.sub(lambda m: "${{" + m.group(1) + "}}", arg)


def _fields(arg: str) -> list[str]:
    """The placeholder names in one argument, in order (TemplateError on a malformed one)."""
    try:
        parsed = list(Formatter().parse(_format_string(arg)))
    except ValueError as e:  # "Single '}' encountered in format string", ...
        raise TemplateError(f"argument {arg!r}: {e} (write {{{{ and }}}} for a literal brace)") from None
    names = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise TemplateError(
                f"argument {arg!r}: {shown} is not a placeholder; placeholders are plain names such "
                f"as {{model}} (write {{{{ and }}}} for a literal brace)"
            )
        names.append(name)
    return names


def placeholders(command: tuple[str, ...] | list[str]) -> list[str]:
    """Every placeholder the template uses, once each, in order of first use."""
    seen: dict[str, None] = {}
    for arg in command:
        for name in _fields(arg):
            seen.setdefault(name)
    return list(seen)


def known(cfg: ServerConfig) -> list[str]:
    """The placeholder names a template of this configuration may use."""
    fields = [n for n, v in cfg if n not in _NOT_PLACEHOLDERS and _scalar(v)]
    return sorted({*fields, *LAUNCH, EXTRA_ARGS, API_KEY, *cfg.command_vars})


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"  # as YAML and --grid spell it
    return str(v)


def values(cfg: ServerConfig, host: str, port: int, api_key: str | None) -> dict[str, str | None]:
    """Placeholder name -> its text for this configuration (None: the setting has no value)."""
    out: dict[str, str | None] = {
        n: None if v is None else _text(v) for n, v in cfg if n not in _NOT_PLACEHOLDERS and _scalar(v)
    }
    # The chain SGLang's adapter launches: steps + 1 draft tokens unless the configuration says otherwise.
    out["num_draft_tokens"] = _text(cfg.num_draft_tokens if cfg.num_draft_tokens else cfg.steps + 1)
    out.update(host=host, port=str(port), api_key=api_key)
    out.update({k: _text(v) for k, v in cfg.command_vars.items()})
    return out


def expand(cfg: ServerConfig, host: str, port: int, api_key: str | None = MASK) -> list[str]:
    """The command of ``cfg``: every placeholder filled, ``{extra_args}`` replaced by the extra args (appended at the
    end when the template does not place them). ``api_key``: the key at launch; the default shows it masked."""
    if not cfg.command:
        raise TemplateError("engine 'command' needs server.command (--command 'SERVER {model} --port {port} ...')")
    used = placeholders(cfg.command)
    allowed = set(known(cfg))
    unknown = [n for n in used if n not in allowed]
    if unknown:
        names = ", ".join("{" + n + "}" for n in unknown)
        raise TemplateError(
            f"unknown placeholder {names} in the command; use {{model}}, {{host}}, {{port}}, "
            f"{{steps}}, {{num_draft_tokens}}, {{tp}}, {{served_model_name}}, {{extra_args}}, "
            f"{{api_key}}, another server setting, or a --grid NAME=... knob; ${{NAME}} reads a secret from the "
            f"environment at launch (write {{{{ and }}}} for a literal brace)"
        )
    if PORT not in used:
        raise TemplateError(
            "the command places no {port}: rig picks the port and waits for the server there (put {port} where "
            "the server takes its port, e.g. --port {port}; a fixed one goes in --port)"
        )
    unused = [k for k in cfg.command_vars if k not in used]
    if unused:
        raise TemplateError(
            f"the command does not use {{{unused[0]}}}: a knob it does not place changes nothing "
            f"(put {{{unused[0]}}} where its value goes)"
        )
    vals = values(cfg, host, port, api_key)
    missing = [n for n in used if n != EXTRA_ARGS and vals.get(n) is None]
    if missing:
        n = missing[0]
        why = (
            "no API key is set (export RIG_API_KEY, or --api-key-env / --api-key-file)"
            if n == API_KEY
            else f"server.{n} is not set"
        )
        raise TemplateError(f"the command uses {{{n}}} but {why}")
    argv: list[str] = []
    for arg in cfg.command:
        if EXTRA_ARGS in _fields(arg):
            if arg != "{" + EXTRA_ARGS + "}":
                raise TemplateError(
                    f"argument {arg!r}: {{extra_args}} stands alone as one argument (it becomes several)"
                )
            argv += list(cfg.extra_args)
        else:
            argv.append(_format_string(arg).format(**vals))
    if EXTRA_ARGS not in used:
        argv += list(cfg.extra_args)  # verbatim at the end, as every engine's extra args go
    return argv


def uses_speculation(cfg: ServerConfig) -> bool:
    """Does the template place the point's speculative setting anywhere?"""
    return any(n in SPECULATIVE for n in placeholders(cfg.command))


def uses_api_key(cfg: ServerConfig) -> bool:
    return API_KEY in placeholders(cfg.command)
