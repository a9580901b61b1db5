"""What a run reads from its environment and never stores: the API key it sends to the server (from a file or a
variable), and the value of each ``${NAME}`` its server settings reference (rig/server/env_refs.py)."""

from __future__ import annotations

import os

from rig.config import RunSpec
from rig.run.errors import RunError, RunInputError
from rig.server import env_refs
from rig.server.command import uses_api_key
from rig.server.spec import ServerConfig


def read_api_key(spec: RunSpec) -> str | None:
    """From the file or the environment variable named in the spec; never stored anywhere."""
    key = _read(spec)
    if key is None and spec.server.engine == "command" and uses_api_key(spec.server):
        raise RunInputError(
            f"server.command places {{api_key}} but no API key is set: export {spec.api_key_env} "
            f"(or give --api-key-env / --api-key-file)"
        )
    return key


def _read(spec: RunSpec) -> str | None:
    if spec.api_key_file:
        try:
            return spec.api_key_file.read_text().strip() or None
        except OSError as e:
            raise RunError(f"api_key_file {spec.api_key_file}: {e.strerror}") from None
    return os.environ.get(spec.api_key_env) or None


def read_server_env(spec: RunSpec, configs: list[ServerConfig]) -> dict[str, str]:
    """NAME -> value for every ``${NAME}`` in the server settings (the spec's and each planned configuration's);
    one error naming every variable that is unset, before anything starts."""
    try:
        return env_refs.read([spec.server, *configs])
    except env_refs.EnvRefError as e:
        raise RunInputError(str(e)) from None
