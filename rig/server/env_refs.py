"""``${NAME}`` in a server's extra arguments, command template and environment: a value read from rig's own
environment at launch.

A secret an engine takes on its command line (SGLang's ``--admin-api-key``, ``--ssl-keyfile-password``) or in its
environment (a hub token) would otherwise be typed into the spec, and the spec is written into the manifest, the
records' ``server_args`` and the screen. With ``--server-arg=--admin-api-key=${ADMIN_KEY}`` the spec keeps the
reference; the driver reads ``ADMIN_KEY`` when the run starts (one clear error if it is unset), hands the value to
the server actor alone, and the actor puts it into the command it launches and masks it wherever it writes. A
command engine's template takes it the same way (``--command 'srv --admin-key ${ADMIN_KEY} --port {port}'``).
A secret flag given a literal value is refused when the spec is read, before anything runs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

from rig.server.redaction import REF
from rig.server.spec import ServerConfig


class EnvRefError(ValueError):
    """A reference rig cannot fill (unset when the run starts, or not read for this launch); the message is one
    line."""


def _texts(cfg: ServerConfig) -> list[str]:
    return [*cfg.extra_args, *cfg.command, *cfg.env.values()]


def names(cfgs: Iterable[ServerConfig]) -> list[str]:
    """Every variable the configurations reference, once each, in order of first use."""
    seen: dict[str, None] = {}
    for cfg in cfgs:
        for text in _texts(cfg):
            for name in REF.findall(text):
                seen.setdefault(name)
    return list(seen)


def read(cfgs: Iterable[ServerConfig], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """NAME -> value for every reference, from rig's environment; EnvRefError naming all that are unset or empty."""
    env = os.environ if environ is None else environ
    wanted = names(cfgs)
    missing = [n for n in wanted if not env.get(n)]
    if missing:
        shown = ", ".join("${" + n + "}" for n in missing)
        raise EnvRefError(f"server settings reference {shown}, not set in this environment: export it before the run")
    return {n: env[n] for n in wanted}


def expand(cfg: ServerConfig, values: Mapping[str, str]) -> ServerConfig:
    """The configuration as launched: each ``${NAME}`` in its extra arguments, command and environment replaced by its
    value (for the actor's command only; the spec, the manifest and the records keep the reference)."""

    def fill(text: str, template: bool = False) -> str:
        def one(m: re.Match[str]) -> str:
            if m.group(1) not in values:
                raise EnvRefError(f"{m.group(0)} was not read when the run started")
            value = values[m.group(1)]
            # a command template is filled with str.format next (rig/server/command.py): a brace in the value is text
            return value.replace("{", "{{").replace("}", "}}") if template else value

        return REF.sub(one, text)

    if not any(REF.search(t) for t in _texts(cfg)):
        return cfg
    return cfg.model_copy(
        update={
            "extra_args": tuple(fill(a) for a in cfg.extra_args),
            "command": tuple(fill(a, template=True) for a in cfg.command),
            "env": {k: fill(v) for k, v in cfg.env.items()},
        }
    )
