"""The whole rig path against a real engine: `rig sweep --engine vllm` (vLLM's CPU build, a tiny local model),
steps 0 and 2 (ngram speculation), greedy and realistic workloads, small concurrency."""

import json
import os
import subprocess
import sys

import pytest
import yaml
from accounting import assert_accounting
from support import OWNER_VAR, engine_procs
from vllm_fixtures import server_config

from rig.results import read_manifest, read_requests

pytestmark = [pytest.mark.slow, pytest.mark.ray]
SHORT = {"median": 120, "sigma": 0.3, "min": 40, "max": 300}  # prompts must fit --max-model-len 2048


@pytest.fixture(scope="module")
def vllm_run(vllm_engine_python, tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm-run")
    cfg = server_config(vllm_engine_python, tiny_model_dir, steps=0)
    spec = {
        "server": {
            "engine": "vllm",
            "model": cfg.model,
            "served_model_name": cfg.served_model_name,
            "tp": 1,
            "device": "cpu",
            "spec_method": "ngram",
            "python": cfg.python,
            "extra_args": list(cfg.extra_args),
            "env": cfg.env,
            "health_timeout_s": 600,
        },
        "steps": [0, 2],
        "workloads": [
            {"name": "greedy", "max_tokens": 48},
            {"name": "realistic", "max_tokens": 48, "chat_prompt_tokens": SHORT, "code_prompt_tokens": SHORT},
        ],
        "load": {"concurrency": [1, 2], "requests": 3, "warmup_requests": 1},
    }
    f = out / "spec.yaml"
    f.write_text(yaml.safe_dump(spec))
    # the owner mark lets test_no_engine_process_left find exactly this run's engines (the session's shared vLLM
    # server of tests/integration/test_real_engines.py may be running beside it)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", OWNER_VAR: str(out)}
    proc = subprocess.run(
        [sys.executable, "-m", "rig.cli", "sweep", "--config", str(f), "--out", str(out), "--run-id", "v", "-q"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return out / "v"


def test_every_request_has_a_record_and_tokens_match_the_engine_counter(vllm_run):
    m = read_manifest(vllm_run)
    t = read_requests(vllm_run).to_pandas()
    assert m["status"] == "complete" and len(m["points"]) == 8
    assert len(t) == 8 * 3 and t.ok.all()
    assert_accounting(vllm_run)
    for p in m["points"]:
        rows = t[t.point == p["point"]]
        assert rows.completion_tokens.sum() == p["server_counters_delta"]["vllm:generation_tokens_total"]
        assert rows.prompt_tokens.sum() == p["server_counters_delta"]["vllm:prompt_tokens_total"]
    assert (t.api == "openai-completions").all() and (t.completion_tokens <= 48).all()


def test_steps_2_reports_acceptance_from_the_counters(vllm_run):
    m = read_manifest(vllm_run)
    for p in m["points"]:
        if p["steps"] == 2:
            acc = p["window_acceptance"]
            assert acc["accepted_tokens"] <= acc["draft_tokens"]
            assert acc["tokens_per_step"] >= 1.0
            if p["workload"] == "greedy":  # the tiny model's greedy output repeats: ngram drafts it well
                assert acc["drafts"] > 0 and acc["accept_length"] > 1.0
            else:  # sampled nonsense gives ngram nothing to match; the counters say so honestly
                assert acc["drafts"] >= 0
        else:
            assert p["window_acceptance"] is None
    rep = subprocess.run(
        [sys.executable, "-m", "rig.cli", "report", str(vllm_run), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    rows = json.loads(rep.stdout)
    assert all(r["accept_length"] > 1.0 for r in rows if r["steps"] == 2 and r["workload"] == "greedy")
    cmds = {c["knobs"]["steps"]: c["command"] for c in m["server_configs"].values()}
    assert "--speculative-config" in cmds[2] and "--speculative-config" not in cmds[0]
    assert all(c["startup"].get("kv_cache_tokens", 0) > 0 for c in m["server_configs"].values())


def test_greedy_output_is_lossless_across_steps(vllm_run):
    t = read_requests(vllm_run).to_pandas()
    g = t[t.workload == "greedy"].pivot_table(
        index=["concurrency", "request_id"], columns="steps", values="output_hash", aggfunc="first"
    )
    assert len(g) == 6 and (g[0] == g[2]).all()


def test_no_engine_process_left(vllm_run):
    assert engine_procs(vllm_run.parent, marker="vllm.entrypoints") == []
