"""The API key a run sends to the server: read from a file or the environment, never stored anywhere."""

from __future__ import annotations

import os

from rig.config import RunSpec
from rig.run.errors import RunError, RunInputError
from rig.server.command import uses_api_key


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
