"""A stalled warm-up stops on one Ctrl-C (integration tier: a stalling server and a rig run; the rest of the hardening
checks are in test_harden3.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from support import TESTS, free_port, start_rig

from rig.results import read_manifest

HERE = TESTS


def _wait_for(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except (FileNotFoundError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"never: {what}")


# ------------------------------------------------------------------------------ 1. one Ctrl-C stops the warm-up
@pytest.mark.ray
def test_one_ctrl_c_during_a_stalled_warm_up_stops_within_10s(tmp_path):
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(HERE / "stall_server.py"), str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        proc = start_rig(
            "run",
            "--engine",
            "external",
            "--url",
            f"http://127.0.0.1:{port}",
            "--steps",
            "0",
            "--concurrency",
            "1",
            "--requests",
            "2",
            "--warmup",
            "1",
            "-q",
            "--out",
            str(tmp_path),
            "--run-id",
            "w",
        )
        run = tmp_path / "w"
        _wait_for(lambda: any(p["status"] == "running" for p in read_manifest(run)["points"]), 180, "warm-up")
        time.sleep(2.0)  # into the warm-up request, which the server stalls after its first token
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)  # once
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()  # the run's own Ray goes with it (it is this process's child)
            proc.communicate()
            raise
        took = time.monotonic() - t0
        assert proc.returncode == 130, err[-3000:]
        assert "Traceback" not in out + err
        # the stop is bounded (a hang fails); 10 s on a quiet host, longer while a busy one tears Ray down
        assert took < 30.0, took
        m = read_manifest(run)
        assert m["status"] == "interrupted"
        assert [p["status"] for p in m["points"]] == ["interrupted"], m["points"][0].get("error")
        assert m["points"][0]["requests_scheduled"] == 0  # the level never started: nothing of it to count
    finally:
        server.kill()
        server.wait()
