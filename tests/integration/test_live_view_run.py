"""rig run and rig sweep on a terminal show the live panel while a level runs: requests, tok/s, TTFT and TPOT so
far, and the server's running/queued requests, power and speculative steps (the simulator reports them all); through
local Ray, so the generators' progress sketches and the server actor's gauges cross real actor calls."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support import OWNER_VAR

pytestmark = pytest.mark.ray

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# a short closed-loop level of short answers: enough for the panel to draw a few frames
SHORT = ["--workload", "realistic", "--concurrency", "2", "--workload-opt", "max_tokens=48", "--warmup", "1"]


def on_a_terminal(args: list[str], out: Path) -> tuple[int, str, bytes]:
    """``rig ARGS`` with stderr on a pty (stdout piped): its exit status, what the terminal showed (ANSI codes
    removed) and stdout."""
    master, slave = pty.openpty()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "140", "TERM": "xterm", OWNER_VAR: str(out)}
    proc = subprocess.Popen([sys.executable, "-m", "rig.cli", *args], stdout=subprocess.PIPE, stderr=slave, env=env)
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
    return proc.returncode, ANSI.sub("", seen.decode("utf-8", "replace")), stdout


def assert_panel(text: str, steps: int) -> None:
    """The panel of a level at ``steps``, and latency lines with figures in them."""
    assert f"live · sim-s{steps}-" in text and "requests  done " in text
    frames = [m.group(0) for m in re.finditer(r"server    [^\r\n│]*", text)]
    assert any(f"spec steps {steps}" in f and "running" in f and "power" in f for f in frames), frames[-5:]
    assert re.search(r"TTFT      p50 [0-9.,]+ ms · p99 [0-9.,]+ ms", text)
    assert re.search(r"TPOT      p50 [0-9.,]+ ms · p99 [0-9.,]+ ms", text)
    assert re.search(r"tok/s     [0-9,]+ \(requests completed", text)


def test_rig_run_on_a_terminal_shows_the_live_panel(tmp_path):
    args = ["run", *SHORT, "--steps", "2", "--duration", "5", "--out", str(tmp_path), "--run-id", "live"]
    rc, text, stdout = on_a_terminal(args, tmp_path)
    assert rc == 0, text[-3000:]
    assert_panel(text, 2)
    assert b"Aggregate" in stdout  # the campaign table still goes to stdout at the end


def test_rig_sweep_on_a_terminal_shows_the_live_panel_for_each_configuration(tmp_path):
    args = ["sweep", *SHORT, "--steps", "0,2", "--duration", "3", "--out", str(tmp_path), "--run-id", "live-sweep"]
    rc, text, stdout = on_a_terminal(args, tmp_path)
    assert rc == 0, text[-3000:]
    for steps in (0, 2):  # one panel per configuration's level, each with its server's steps
        assert_panel(text, steps)
    assert b"Aggregate" in stdout
