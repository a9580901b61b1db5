"""Helpers the test files share: running the CLI, spec files for the SGLang double, free ports, engine processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import yaml

DOUBLES = str(Path(__file__).parent / "doubles")
# Set in the environment of every rig process a test starts; local Ray's raylet and workers inherit the driver's
# environment, and so does the engine they launch, which lets a test find exactly the processes of its own run.
OWNER_VAR = "RIG_TEST_OWNER"


def _env(env: dict[str, str] | None, owner: str | os.PathLike[str] | None) -> dict[str, str]:
    """The environment of a rig process a test starts: wide output, no usage stats, the owner mark when given."""
    full = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "200", **(env or {})}
    if owner is not None:
        full[OWNER_VAR] = str(owner)
    return full


def rig(*args: str, timeout: float = 240, env: dict[str, str] | None = None,
        owner: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess:
    """Run `rig ARGS` in a fresh interpreter (what a user runs) and wait for it."""
    return subprocess.run([sys.executable, "-m", "rig.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=_env(env, owner))


def start_rig(*args: str, owner: str | os.PathLike[str] | None = None) -> subprocess.Popen:
    """Start `rig ARGS` without waiting (for tests that signal or kill it)."""
    return subprocess.Popen([sys.executable, "-m", "rig.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(None, owner))


def spec_file(tmp_path: Path, **env: str) -> Path:
    """A run spec whose server finds the SGLang double (tests/doubles) first, with extra engine environment."""
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump({"server": {"env": {"PYTHONPATH": DOUBLES, OWNER_VAR: str(tmp_path), **env}}}))
    return f


def free_port() -> int:
    """A TCP port on loopback nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_procs(owner: str | os.PathLike[str], marker: str = "sglang.launch_server") -> list[psutil.Process]:
    """Live engine processes (cmdline contains ``marker``) started by the test that used ``owner``, not by others."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if marker not in " ".join(p.info["cmdline"] or []):
            continue
        try:
            if p.environ().get(OWNER_VAR) == str(owner) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found
