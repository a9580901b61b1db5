"""Helpers the test files share: running the CLI, spec files for the SGLang double, free ports, engine processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import yaml

# Where things are, for test files in any folder of tests/ (unit/, integration/): never from a test file's own path.
TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DATA = TESTS / "data"
DOUBLES = str(TESTS / "doubles")
# Set in the environment of every rig process a test starts; local Ray's raylet and workers inherit the driver's
# environment, and so does the engine they launch, which lets a test find exactly the processes of its own run.
OWNER_VAR = "RIG_TEST_OWNER"


def _env(env: dict[str, str] | None, owner: str | os.PathLike[str] | None) -> dict[str, str]:
    """The environment of a rig process a test starts: wide output, no usage stats, the owner mark when given."""
    full = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "200", **(env or {})}
    if owner is not None:
        full[OWNER_VAR] = str(owner)
    return full


def rig(
    *args: str, timeout: float = 240, env: dict[str, str] | None = None, owner: str | os.PathLike[str] | None = None
) -> subprocess.CompletedProcess:
    """Run `rig ARGS` in a fresh interpreter (what a user runs) and wait for it."""
    return subprocess.run(
        [sys.executable, "-m", "rig.cli", *args], capture_output=True, text=True, timeout=timeout, env=_env(env, owner)
    )


def start_rig(*args: str, owner: str | os.PathLike[str] | None = None) -> subprocess.Popen:
    """Start `rig ARGS` without waiting (for tests that signal or kill it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "rig.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(None, owner),
    )


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


def start_sim(
    log_dir: Path, name: str, model: str, extra: list[str], timeout_s: float = 30
) -> tuple[subprocess.Popen, str, Path]:
    """``python -m rig.sim`` (TP 4, seed 7, loopback, a free port, its log in ``log_dir``), returned once /health
    answers 200; RuntimeError with the log if it exits first or never answers."""
    import time
    import urllib.request

    port = free_port()
    log = log_dir / f"{name}.log"
    argv = [
        sys.executable,
        "-m",
        "rig.sim",
        "--model-path",
        model,
        "--tp-size",
        "4",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--random-seed",
        "7",
        *extra,
    ]
    proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(log.read_text())
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return proc, url, log
        except Exception:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"sim did not become healthy: {log.read_text()}")


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


def sglang_source(version: str) -> Path:
    """SGLang's source for ``version``: $RIG_SGLANG_SRC (an unpacked wheel), else the wheel from the package index,
    unpacked once under $RIG_CACHE (the only network this needs is the package registry CI already uses)."""
    import zipfile

    import pytest

    if os.environ.get("RIG_SGLANG_SRC"):
        return Path(os.environ["RIG_SGLANG_SRC"])
    cache = Path(os.environ.get("RIG_CACHE") or REPO / ".cache").resolve()
    root = cache / f"sglang-{version}-src"
    if (root / "sglang" / "srt" / "server_args.py").is_file():
        return root
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", f"sglang=={version}", "-d", str(wheels)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if p.returncode != 0 or not found:
        pytest.skip(f"cannot download sglang=={version} from the package index: {p.stderr.strip()[-300:]}")
    tmp = root.with_name(root.name + ".partial")
    with zipfile.ZipFile(found[0]) as z:
        z.extractall(tmp, [n for n in z.namelist() if n.startswith("sglang/")])
    tmp.rename(root)
    return root
