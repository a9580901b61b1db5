"""Real-engine fixtures for `transformers serve` on CPU, launched through the command engine.

tests/conftest.py makes the fixtures available to every test module:

- ``tserve_executable``: the venv's ``transformers`` (scripts/tserve-env.sh; it chains the vLLM CPU venv's torch:
  ~30 s the first time, cached).
- ``tserve_server``: one ``transformers serve TINY_MODEL --continuous-batching`` for the whole session, started by
  the rig's own ServerActor with engine ``command`` (the code the Ray actor runs: launch_argv, Popen, wait_ready,
  stop), on the tiny model of tests/vllm_fixtures.py.

``RIG_SKIP_VLLM=1`` (the venv shares vLLM's) or ``RIG_SKIP_TSERVE=1`` skips these tests with a stated reason;
without them they never skip: a failed install or launch fails the test with the log's tail.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from vllm_fixtures import REPO, _tail, cache_root

from rig.server.spec import ServerConfig

if TYPE_CHECKING:  # imported when a server starts: collecting the fast tier loads no Ray
    from rig.server.actor import ServerActor

STARTUP_TIMEOUT_S = float(os.environ.get("RIG_TSERVE_STARTUP_TIMEOUT", "300"))

# What the lead runs on a GPU node, minus the GPU: `transformers serve MODEL --continuous-batching` (5.17).
COMMAND = (
    "serve",
    "{model}",
    "--continuous-batching",
    "--host",
    "{host}",
    "--port",
    "{port}",
    "--device",
    "cpu",
    "{extra_args}",
)
# Continuous batching sizes its KV cache from the device's free memory (90 % of it: ContinuousBatchingConfig
# max_memory_percent, generation/continuous_batching/cache.py get_available_memory); on CPU that is the host's RAM
# (17 GB here, and the OOM killer took it). A fixed cache instead: 64 blocks of 256 tokens, 2048 tokens per batch.
EXTRA_ARGS = ("--cb-num-blocks", "64", "--cb-max-batch-tokens", "2048")
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def skip_if_requested() -> None:
    for var in ("RIG_SKIP_VLLM", "RIG_SKIP_TSERVE"):
        if os.environ.get(var) == "1":
            pytest.skip(f"{var}=1: real-engine (transformers serve on CPU) tests skipped on request")


def ensure_tserve(venv_dir: Path | None = None) -> Path:
    """Create the transformers-serve venv if needed (idempotent, locked) and return its ``transformers``."""
    venv_dir = venv_dir or cache_root() / "tserve-venv"
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "tserve-env.sh"), str(venv_dir)], capture_output=True, text=True, cwd=REPO
    )
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/tserve-env.sh failed ({proc.returncode}):\n{_tail(proc.stderr)}")
    return Path(proc.stdout.strip().splitlines()[-1])


def server_config(executable: Path, model: Path) -> ServerConfig:
    return ServerConfig(
        engine="command",
        command=(str(executable), *COMMAND),
        model=str(model),
        tp=1,
        device="cpu",
        host="127.0.0.1",
        extra_args=EXTRA_ARGS,
        env=ENV,
        health_timeout_s=STARTUP_TIMEOUT_S,
    )


@dataclass
class TServeServer:
    actor: ServerActor
    loop: asyncio.AbstractEventLoop
    cfg: ServerConfig
    url: str
    startup_s: float

    def log_text(self) -> str:
        return self.actor.log_path.read_text(errors="replace")

    def stop(self) -> int | None:
        try:
            return self.loop.run_until_complete(self.actor.stop(grace_s=10))
        finally:
            self.loop.close()


def start_tserve(executable: Path, model: Path, log_dir: Path) -> TServeServer:
    """Launch through the command engine's server actor and wait until /health answers 200."""
    from rig.server.actor import ServerActor, ServerError

    cfg = server_config(executable, model)
    actor = ServerActor(cfg, str(log_dir), "tserve.log")
    loop = asyncio.new_event_loop()
    started = loop.run_until_complete(actor.start())
    try:
        ready = loop.run_until_complete(actor.wait_ready())
    except ServerError as e:
        loop.run_until_complete(actor.stop(grace_s=5))
        loop.close()
        raise RuntimeError(
            f"transformers serve did not start: {str(e).splitlines()[0]}; log "
            f"{actor.log_path}:\n{_tail(actor.log_path.read_text(errors='replace'))}"
        ) from None
    return TServeServer(actor=actor, loop=loop, cfg=cfg, url=started.url, startup_s=ready.ready_after_s)


@pytest.fixture(scope="session")
def tserve_executable() -> Path:
    skip_if_requested()
    return ensure_tserve()


@pytest.fixture(scope="module")  # stopped after its module: an idle engine beside later tests slows them
def tserve_server(tserve_executable: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    server = start_tserve(tserve_executable, tiny_model_dir, tmp_path_factory.mktemp("tserve-logs"))
    yield server
    server.stop()
