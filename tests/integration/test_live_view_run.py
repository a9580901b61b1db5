"""rig run on a terminal shows the live panel while a level runs: requests, tok/s, TTFT and TPOT so far, and the
server's running/queued requests, power and speculative steps (the simulator reports them all); through local Ray,
so the generators' progress sketches and the server actor's gauges cross real actor calls."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import threading

import pytest
from support import OWNER_VAR

pytestmark = pytest.mark.ray

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_rig_run_on_a_terminal_shows_the_live_panel(tmp_path):
    master, slave = pty.openpty()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "140", "TERM": "xterm", OWNER_VAR: str(tmp_path)}
    argv = [sys.executable, "-m", "rig.cli", "run", "--workload", "realistic", "--steps", "2", "--concurrency", "2"]
    argv += ["--duration", "5", "--workload-opt", "max_tokens=48", "--warmup", "1"]
    argv += ["--out", str(tmp_path), "--run-id", "live"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, env=env)  # stderr is the terminal
    os.close(slave)
    seen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed its end
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    stdout, _ = proc.communicate(timeout=240)
    reader.join(timeout=10)
    os.close(master)
    text = ANSI.sub("", seen.decode("utf-8", "replace"))
    assert proc.returncode == 0, text[-3000:]
    assert "live · sim-s2-" in text and "requests  done " in text
    frames = [m.group(0) for m in re.finditer(r"server    [^\r\n│]*", text)]
    assert any("spec steps 2" in f and "running" in f and "power" in f for f in frames), frames[-5:]
    assert re.search(r"TTFT      p50 [0-9.,]+ ms · p99 [0-9.,]+ ms", text)
    assert re.search(r"TPOT      p50 [0-9.,]+ ms · p99 [0-9.,]+ ms", text)
    assert re.search(r"tok/s     [0-9,]+ \(requests completed", text)
    assert b"Aggregate" in stdout  # the campaign table still goes to stdout at the end
