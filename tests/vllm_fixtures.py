"""Real-engine fixtures: vLLM's CPU build in its own venv, the tiny local model, and shared server launches.

tests/conftest.py makes the fixtures available to every test module:

- ``vllm_engine_python``: the engine venv's interpreter (scripts/vllm-env.sh; ~2 min the first time, cached).
- ``tiny_model_dir``: the tiny Llama model (rig/server/tiny_model.py, run by the engine venv; ~12 s, cached).
- ``vllm_servers``: ``vllm_servers.get(steps)`` starts (once per steps value for the whole session) a real
  ``vllm.entrypoints.openai.api_server`` with the rig's own adapter argv, and stops every server at session end.

Caches live under ``$RIG_CACHE`` or ``<repo>/.cache`` (git-ignored). Set ``RIG_SKIP_VLLM=1`` to skip these tests
with a stated reason; without it they never skip: a failed install or launch fails the test with the log's tail.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from support import free_port  # noqa: E402

from rig.server import tiny_model  # noqa: E402  (stdlib-only at import time)
from rig.server.engines import VLLMAdapter  # noqa: E402
from rig.server.spec import ServerConfig  # noqa: E402

SERVED_NAME = "tiny"
MAX_MODEL_LEN = 2048
STARTUP_TIMEOUT_S = float(os.environ.get("RIG_VLLM_STARTUP_TIMEOUT", "600"))

# What every test launch of vLLM gets in its environment: a small KV cache, no hub, no usage reporting.
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def cache_root() -> Path:
    return Path(os.environ.get("RIG_CACHE") or REPO / ".cache").resolve()


def skip_if_requested() -> None:
    if os.environ.get("RIG_SKIP_VLLM") == "1":
        pytest.skip("RIG_SKIP_VLLM=1: real-engine (vLLM CPU) tests skipped on request")


def _tail(text: str, n: int = 40) -> str:
    return "\n".join(text.splitlines()[-n:])


def ensure_engine_python(venv_dir: Path | None = None) -> Path:
    """Create the engine venv if needed (idempotent, locked) and return its python."""
    venv_dir = venv_dir or cache_root() / "vllm-venv"
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "vllm-env.sh"), str(venv_dir)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/vllm-env.sh failed ({proc.returncode}):\n{_tail(proc.stderr)}")
    return Path(proc.stdout.strip().splitlines()[-1])


def ensure_tiny_model(python: Path, out_dir: Path | None = None) -> Path:
    """Build the tiny model with the engine venv's python unless the cached one matches the recipe."""
    out_dir = out_dir or cache_root() / "tiny-model"
    if tiny_model.is_built(out_dir):
        return out_dir
    proc = subprocess.run(
        [str(python), str(Path(tiny_model.__file__).resolve()), str(out_dir)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **ENGINE_ENV},
    )
    if proc.returncode != 0 or not tiny_model.is_built(out_dir):
        raise RuntimeError(f"tiny model build failed ({proc.returncode}):\n{_tail(proc.stderr)}")
    return out_dir


def server_config(python: Path, model: Path, steps: int, extra_args: tuple[str, ...] = ()) -> ServerConfig:
    return ServerConfig(
        engine="vllm",
        model=str(model),
        tp=1,
        device="cpu",
        steps=steps,
        spec_method="ngram",
        served_model_name=SERVED_NAME,
        python=str(python),
        # -O0: no torch.compile. What these tests check is rig against vLLM's contract, not vLLM's speed, and a cold
        # start took 73 s with compilation and 38 s without (2 cores, 2026-12-01).
        extra_args=("--dtype", "bfloat16", "--max-model-len", str(MAX_MODEL_LEN), "-O0", *extra_args),
        # vLLM's caches go beside the venv, not into ~/.cache
        env={**ENGINE_ENV, "VLLM_CACHE_ROOT": str(cache_root() / "vllm-cache")},
    )


def _get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def kill_tree(proc: subprocess.Popen, grace_s: float = 30.0) -> tuple[list[psutil.Process], list[int]]:
    """SIGTERM the server (vLLM tears its own children down), then SIGKILL whatever of the tree is left.

    Returns the tree as it was before the signal and the pids of it still running afterwards (empty when clean).
    """
    try:
        root = psutil.Process(proc.pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    if proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    _, alive = psutil.wait_procs(tree, timeout=5)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    _, alive = psutil.wait_procs(alive, timeout=5)
    if proc.poll() is None:
        proc.wait(5)
    return tree, [p.pid for p in alive if _alive(p)]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@dataclass
class VLLMServer:
    steps: int
    cfg: ServerConfig
    argv: list[str]
    port: int
    proc: subprocess.Popen
    log_path: Path
    startup_s: float = 0.0
    tree: list[psutil.Process] = field(default_factory=list)  # the process tree when it was stopped
    leftover: list[int] = field(default_factory=list)  # pids of that tree still running after stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        return _get(self.url + path)

    def get_json(self, path: str) -> dict:
        status, body = self.get(path)
        assert status == 200, f"GET {path} -> {status}: {body[:300]}"
        return json.loads(body)

    def stop(self) -> list[int]:
        self.tree, self.leftover = kill_tree(self.proc)
        return self.leftover


def start_vllm_server(
    python: Path, model: Path, steps: int, log_dir: Path, extra_args: tuple[str, ...] = (), attempts: int = 2
) -> VLLMServer:
    """Launch the real server with the rig's adapter argv (plain Popen) and wait for /health 200."""
    engine = VLLMAdapter()
    cfg = server_config(python, model, steps, extra_args)
    log_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, attempts + 1):
        port = free_port()
        argv = engine.argv(cfg, "127.0.0.1", port)
        log_path = log_dir / f"vllm-s{steps}-{port}.log"
        t0 = time.monotonic()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **engine.env(cfg)},
                cwd=log_dir,
            )
        server = VLLMServer(steps=steps, cfg=cfg, argv=argv, port=port, proc=proc, log_path=log_path)
        deadline = t0 + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            with contextlib.suppress(OSError):
                if _get(server.url + engine.health_path(), timeout=2)[0] == 200:
                    server.startup_s = time.monotonic() - t0
                    return server
            time.sleep(1.0)
        _, leftover = kill_tree(proc)
        text = server.log_text()
        if "Address already in use" in text and attempt < attempts:
            continue  # the bind-then-close race lost the port: try another
        why = (
            f"exited with {proc.returncode}" if proc.returncode is not None else f"not healthy in {STARTUP_TIMEOUT_S}s"
        )
        raise RuntimeError(f"vLLM (steps={steps}) {why}; leftover pids {leftover}; log {log_path}:\n{_tail(text)}")
    raise AssertionError("unreachable")


class VLLMServers:
    """One server per steps value for the whole session, started on first use."""

    def __init__(self, python: Path, model: Path, log_dir: Path) -> None:
        self.python, self.model, self.log_dir = python, model, log_dir
        self.servers: dict[int, VLLMServer] = {}
        self.stopped: list[VLLMServer] = []

    def get(self, steps: int) -> VLLMServer:
        server = self.servers.get(steps)
        if server is None or server.proc.poll() is not None:
            # Keep at most one engine alive at a time: two share 2 cores badly and double the memory.
            self.stop_all()
            server = self.servers[steps] = start_vllm_server(self.python, self.model, steps, self.log_dir)
        return server

    def stop_all(self) -> dict[int, list[int]]:
        """Stop every running server; returns steps -> pids of its tree still alive afterwards."""
        leftovers = {}
        for steps, server in list(self.servers.items()):
            leftovers[steps] = server.stop()
            self.stopped.append(server)
            del self.servers[steps]
        return leftovers


_REGISTRY: dict[str, VLLMServers] = {}  # survives this module being imported into several test modules


def stop_vllm_servers() -> None:
    """Stop the session's vLLM servers, if any run (VLLMServers.get starts one again on demand)."""
    servers = _REGISTRY.get("servers")
    if servers is not None:
        servers.stop_all()


@pytest.fixture(scope="session")
def vllm_engine_python() -> Path:
    skip_if_requested()
    return ensure_engine_python()


@pytest.fixture(scope="session")
def tiny_model_dir(vllm_engine_python: Path) -> Path:
    return ensure_tiny_model(vllm_engine_python)


@pytest.fixture(scope="session")
def vllm_servers(vllm_engine_python: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    servers = _REGISTRY.get("servers")
    if servers is None:
        servers = _REGISTRY["servers"] = VLLMServers(
            vllm_engine_python, tiny_model_dir, tmp_path_factory.mktemp("vllm-logs")
        )
    yield servers
    servers.stop_all()
