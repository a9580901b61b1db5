"""vLLM's CPU build runs a speculative schedule by batch size under rig (issue 29 item 6): `rig sweep --engine vllm
--spec-schedule [[1,1,3],[2,64,1]]`, ngram, concurrency 1 then 8 on the same server (one engine launch).

vLLM picks K per scheduler step from the number of scheduled requests (vllm/v1/core/sched/scheduler.py:1485-1490)
and its ngram proposer drafts at most that many tokens (v1/worker/gpu_model_runner.py, propose(num_spec_tokens_to_
schedule, ...); the CPU model runner is a GPUModelRunner). So its own counters must show up to 3 draft tokens per draft
at C=1 and at most 1 whenever two or more requests run."""

import os
import subprocess
import sys

import pytest
import yaml
from support import OWNER_VAR, engine_procs
from vllm_fixtures import server_config, stop_vllm_servers

from rig.results import read_manifest, read_requests

pytestmark = [pytest.mark.slow, pytest.mark.ray]
SCHEDULE = [[1, 1, 3], [2, 64, 1]]  # K=3 for a request alone, K=1 from two on


@pytest.fixture(scope="module")
def scheduled_run(vllm_engine_python, tiny_model_dir, tmp_path_factory):
    stop_vllm_servers()  # never two engines on the 2 cores: the session's shared server may be up
    out = tmp_path_factory.mktemp("vllm-schedule")
    cfg = server_config(vllm_engine_python, tiny_model_dir, steps=0)
    spec = {
        "server": {
            **{k: v for k, v in cfg.model_dump().items() if k in ("engine", "model", "served_model_name", "tp")},
            **{k: v for k, v in cfg.model_dump().items() if k in ("device", "spec_method", "python", "env")},
            "extra_args": list(cfg.extra_args),
            "health_timeout_s": 600,
        },
        # the greedy workload: the tiny model's greedy text repeats, so ngram finds drafts of the full K
        "workloads": [{"name": "greedy", "max_tokens": 48}],
        "load": {"concurrency": [1, 8], "warmup_requests": 1},  # 4 requests at C=1, 16 at C=8
    }
    f = out / "spec.yaml"
    f.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", OWNER_VAR: str(out)}
    proc = subprocess.run(
        [sys.executable, "-m", "rig.cli", "sweep", "--config", str(f), "--out", str(out), "--run-id", "s", "-q"]
        + ["--spec-schedule", "[[1, 1, 3], [2, 64, 1]]"],  # vLLM's own list, as rig's schedule writer prints it
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return out / "s"


def _drafts(point: dict) -> tuple[float, float]:
    """vLLM's own counters over the point: (draft steps, draft tokens)."""
    d = point["server_counters_delta"]
    return d["vllm:spec_decode_num_drafts_total"], d["vllm:spec_decode_num_draft_tokens_total"]


def test_the_schedule_is_launched_recorded_and_labelled(scheduled_run):
    m = read_manifest(scheduled_run)
    assert m["status"] == "complete" and len(m["server_configs"]) == 1
    ((cid, entry),) = m["server_configs"].items()
    assert cid.startswith("vllm-sched-")  # not labelled as fixed steps
    assert entry["knobs"]["spec_schedule"] == SCHEDULE and entry["knobs"]["steps"] == 3  # steps: the largest K
    spec_config = entry["command"][entry["command"].index("--speculative-config") + 1]
    assert '"num_speculative_tokens_per_batch_size":[[1,1,3],[2,64,1]]' in spec_config
    eff = entry["effective"]
    assert eff["requested"]["spec_schedule"] == eff["effective"]["spec_schedule"] == "1-1:3,2-64:1"
    assert eff["effective"]["steps"] == 3 and eff["changed"] == []  # read back from vLLM's engine config line
    t = read_requests(scheduled_run).to_pandas()
    assert t.ok.all() and len(t) == 4 + 16
    assert all('"spec_schedule": [[1, 1, 3], [2, 64, 1]]' in a for a in t.server_args)


def test_vllms_counters_show_k_switch_with_the_batch_size(scheduled_run):
    points = {p["concurrency"]: p for p in read_manifest(scheduled_run)["points"]}
    drafts_1, tokens_1 = _drafts(points[1])
    drafts_8, tokens_8 = _drafts(points[8])
    assert drafts_1 > 0 and drafts_8 > 0
    # C=1: every step has one request, so K=3: drafts of up to 3 tokens (ngram drafts fewer only near the end)
    assert 2.0 < tokens_1 / drafts_1 <= 3.0
    # C=8: K=1 whenever two or more requests are scheduled; only the steps where one request is left alone (the
    # last to finish) may draft 3. 16 requests of 48 tokens give some 400 drafts of 1 token, so a handful of lone
    # steps cannot lift the ratio near 1.25.
    assert 1.0 <= tokens_8 / drafts_8 < 1.25
    # the fixed-steps reading (3 tokens per draft at every batch size) is what the schedule is not
    assert tokens_8 / drafts_8 < tokens_1 / drafts_1 - 0.75


def test_no_engine_process_left(scheduled_run):
    assert engine_procs(scheduled_run.parent, marker="vllm.entrypoints") == []
