"""A rig sweep against the strict OpenAI server double has no failed request (integration tier; the double's own
checks are in test_openai_strict.py)."""

from __future__ import annotations

import time

import pytest
from doubles import openai_strict

from rig.results import read_requests


# ------------------------------------------------------------------------------------------ rig run, end to end
@pytest.fixture(scope="module")
def strict_url():
    """The strict server as its own process on a free port (what a user's external server is)."""
    import socket
    import subprocess
    import sys
    import urllib.request
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, str(Path(openai_strict.__file__)), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "the strict server did not start"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.ray
@pytest.mark.server
@pytest.mark.parametrize("api", ["openai-completions", "openai-chat"])
def test_rig_sweep_against_the_strict_server_has_no_failed_request(strict_url, api, tmp_path):
    from support import rig

    from rig.results import read_manifest

    proc = rig(
        "sweep",
        "--engine",
        "external",
        "--url",
        strict_url,
        "--api",
        api,
        "--workload",
        "greedy,realistic",
        "--concurrency",
        "1,4",
        "--requests",
        "8",
        "--warmup",
        "1",
        "--out",
        str(tmp_path),
        "--run-id",
        "s",
        "--extra-body",
        'user="rig-test"',
        "-q",
    )  # a field of OpenAI's reference rig does not send itself
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = tmp_path / "s"
    m = read_manifest(run_dir)
    (entry,) = m["server_configs"].values()
    assert (entry["ready_probe"], entry["dialect"], entry["dialect_source"], entry["extra_body"]) == (
        "/v1/models",
        "plain",
        "default",
        {"user": "rig-test"},
    )
    t = read_requests(run_dir).to_pandas()
    assert len(t) == 32 and t.ok.all() and (t.status == "ok").all()
    # the server's own count (its usage chunk), and on this server one token per chunk
    assert (t.completion_tokens_source == "usage").all() and (t.completion_tokens == t.chunk_tokens.apply(sum)).all()
    for p in m["points"]:
        assert p["status"] == "complete" and p["records"] == {"ok": 8, "failed": 0, "cancelled": 0}
        rows = t[t.point == p["point"]]
        early = int((rows.ignore_eos & (rows.completion_tokens < rows.max_tokens)).sum())
        if p["workload"] == "greedy":  # ~1,000 tokens asked; the double's EOS comes within 52
            assert early == 8 and p["flag_reasons"]["ended_early"].startswith("8 of 8 requests")
        else:
            assert "ended_early" not in p["flags"] and not rows.ignore_eos.any()
    assert "ended_early: 8 of 8 requests asked for a fixed length" in proc.stdout
    # said before the points ran, and kept in the manifest
    assert any("workload greedy asks for a fixed output length (ignore_eos)" in w for w in entry["warnings"])
