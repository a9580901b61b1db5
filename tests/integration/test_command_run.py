"""`rig sweep --engine command` through Ray: the server actor launches the command template once per server
configuration (here the simulated server, an OpenAI-compatible program rig did not have to know), waits on its
health, keeps its log, tears it down and launches the next configuration's command."""

import sys

import psutil
import pytest
import yaml
from accounting import assert_accounting
from support import rig

from rig.results import read_manifest, read_requests, server_log_path

pytestmark = [pytest.mark.ray, pytest.mark.server]

# The simulated server started the way any foreign server is: from an argument list with placeholders, and a knob
# of the template's own ({mrr}) swept with --grid.
SIM = [
    sys.executable,
    "-m",
    "rig.sim",
    "--model-path",
    "{model}",
    "--tp-size",
    "{tp}",
    "--host",
    "{host}",
    "--port",
    "{port}",
    "--enable-metrics",
    "--speculative-algorithm",
    "NEXTN",
    "--speculative-num-steps",
    "{steps}",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "{num_draft_tokens}",
    "--max-running-requests",
    "{mrr}",
    "--sim-no-access-log",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("command-run")
    spec = {
        "server": {"engine": "command", "command": SIM, "model": "sim-model", "tp": 4, "device": "cpu"},
        "steps": [2],
        "workloads": [{"name": "greedy", "max_tokens": 16}],
        "load": {"concurrency": [2], "requests": 4, "warmup_requests": 0},
    }
    f = out / "spec.yaml"
    f.write_text(yaml.safe_dump(spec))
    proc = rig("sweep", "--config", str(f), "--grid", "mrr=4,8", "--out", str(out), "--run-id", "c", "-q")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return out / "c"


def test_one_launch_per_configuration_with_its_own_expanded_command_and_log(run):
    m = read_manifest(run)
    configs = m["server_configs"]
    assert len(configs) == 2
    by_mrr = {}
    for cid, c in configs.items():
        cmd = c["command"]
        assert cmd[:3] == [sys.executable, "-m", "rig.sim"]
        port = cmd[cmd.index("--port") + 1]
        assert c["url"] == f"http://127.0.0.1:{port}"  # the port the template was given is the one rig polled
        assert cmd[cmd.index("--speculative-num-draft-tokens") + 1] == "3"  # steps 2 + 1
        assert c["knobs"]["command_vars"] == {"mrr": int(cmd[cmd.index("--max-running-requests") + 1])}
        by_mrr[c["knobs"]["command_vars"]["mrr"]] = cid
        log = server_log_path(run, cid).read_text()
        assert f"max_running_requests={c['knobs']['command_vars']['mrr']}" in log  # the sim's own startup line
        assert c["status"] == "stopped" or c.get("ready_after_s", 0) > 0
    assert sorted(by_mrr) == [4, 8]
    # a launched command is probed like an external server: the sim answers /model_info as only SGLang does
    assert {(c["dialect"], c["dialect_source"]) for c in configs.values()} == {("sglang", "probe:/model_info")}


def test_every_request_ok_and_tokens_match_the_servers_counter(run):
    m = read_manifest(run)
    t = read_requests(run).to_pandas()
    assert m["status"] == "complete" and len(m["points"]) == 2
    assert len(t) == 8 and t.ok.all() and (t.engine == "command").all() and (t.api == "openai-completions").all()
    assert_accounting(run)
    for p in m["points"]:
        rows = t[t.point == p["point"]]
        assert rows.completion_tokens.sum() == p["server_counters_delta"]["sglang:generation_tokens_total"]


def test_no_server_process_left(run):
    left = [
        p
        for p in psutil.process_iter(["cmdline"])
        if "--max-running-requests" in (p.info["cmdline"] or []) and "rig.sim" in (p.info["cmdline"] or [])
    ]
    assert left == []
