"""The API key is sent as a Bearer token, and ${NAME} values reach the server's command and environment; none of them
ever lands in results, logs, manifests or CLI output."""

import os
import subprocess
import sys

import pytest
import yaml
from accounting import assert_accounting
from support import DOUBLES

from rig.results import read_manifest, read_requests

pytestmark = pytest.mark.ray
SECRET = "sk-rig-test-8c1f2a9d5e"
ADMIN = "adm-rig-test-3b7e01"  # --admin-api-key=${MY_ADMIN}
TOKEN = "hub-rig-test-9d44c2"  # server.env HUB_TOKEN: ${MY_TOKEN}


def test_api_key_is_used_but_never_written(tmp_path):
    spec = tmp_path / "spec.yaml"
    server = {"env": {"PYTHONPATH": DOUBLES, "HUB_TOKEN": "${MY_TOKEN}"}, "extra_args": ["--admin-api-key=${MY_ADMIN}"]}
    spec.write_text(yaml.safe_dump({"server": server}))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "MY_KEY": SECRET, "MY_ADMIN": ADMIN, "MY_TOKEN": TOKEN}
    args = [
        "run",
        "--config",
        str(spec),
        "--engine",
        "sglang",
        "--engine-python",
        sys.executable,
        "--model",
        "m",
        "--tp",
        "1",
        "--steps",
        "1",
        "--concurrency",
        "2",
        "--requests",
        "3",
        "--workload",
        "greedy",
        "--workload-opt",
        "max_tokens=4",
        "--api-key-env",
        "MY_KEY",
        "--out",
        str(tmp_path),
        "--run-id",
        "sec",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "rig.cli", *args], capture_output=True, text=True, env=env, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = tmp_path / "sec"
    t = read_requests(run).to_pandas()
    assert len(t) == 3 and t.ok.all()  # the double answers 401 without the right Bearer token
    assert_accounting(run)
    m = read_manifest(run)
    (cfg,) = m["server_configs"].values()
    assert cfg["server_info"]["api_key"] == "***" and "***" in cfg["command"]
    assert "--api-key ***" in cfg["server_info"]["launch_command"]  # SGLang echoes its command line
    log = next(run.glob("logs/*/server.log")).read_text()
    assert "api_key='***'" in log
    # the references were filled at launch (the server got the values, masked in its log copy), and kept in the spec
    assert "admin_api_key='***'" in log and "hub_token='***'" in log and "${" not in log
    assert cfg["server_info"]["admin_api_key"] == "***" and "--admin-api-key=***" in cfg["command"]
    assert m["spec"]["server"]["extra_args"] == ["--admin-api-key=${MY_ADMIN}"]
    assert m["spec"]["server"]["env"]["HUB_TOKEN"] == "${MY_TOKEN}"
    unset = subprocess.run(
        [sys.executable, "-m", "rig.cli", *args, "--run-id", "unset"],
        capture_output=True,
        text=True,
        env={k: v for k, v in env.items() if k != "MY_TOKEN"},
        timeout=60,
    )
    assert unset.returncode == 2 and "${MY_TOKEN}" in unset.stderr and not (tmp_path / "unset").exists(), unset.stderr
    dry = subprocess.run(
        [sys.executable, "-m", "rig.cli", *args, "--dry-run"], capture_output=True, text=True, env=env, timeout=60
    )
    assert dry.returncode == 0
    for blob in [proc.stdout, proc.stderr, dry.stdout, dry.stderr]:
        for secret in (SECRET, ADMIN, TOKEN):
            assert secret not in blob
    for f in run.rglob("*"):
        if f.is_file():
            for secret in (SECRET, ADMIN, TOKEN):
                assert secret.encode() not in f.read_bytes(), f"a secret leaked into {f}"
