"""The matrix of real engines on CPU with the tiny local model: every route each engine offers, greedy and realistic,
through the rig (CLI, Ray, generators, Parquet): no failed request, and the Parquet's completion tokens are the
server's own count.

One server per engine for the whole session (tests/vllm_fixtures.py, tests/tserve_fixtures.py), measured as an
external server: transformers serve is launched by the command engine's server actor, vLLM by its adapter's argv.
vLLM's completions route through the whole vllm engine path (launch per steps value, ngram speculation) is
tests/integration/test_vllm_run.py; the command engine's Ray lifecycle (relaunch per configuration) is
tests/integration/test_command_run.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from accounting import assert_accounting
from vllm_fixtures import SERVED_NAME

from rig.results import read_manifest, read_requests

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.server]

SHORT = {"median": 120, "sigma": 0.3, "min": 40, "max": 300}  # prompts must fit vLLM's --max-model-len 2048
MAX_TOKENS = 32
LEVELS, REQUESTS = [2], 4
# (engine, route): every OpenAI route each engine serves. vLLM's completions: test_vllm_run.py.
MATRIX = [("tserve", "openai-completions"), ("tserve", "openai-chat"), ("vllm", "openai-chat")]


@pytest.fixture(scope="module", params=MATRIX, ids=[f"{e}-{a}" for e, a in MATRIX])
def engine_run(request, tiny_model_dir, tmp_path_factory):
    engine, api = request.param
    if engine == "tserve":
        server = request.getfixturevalue("tserve_server")
        # transformers serve is pinned to the model it was started with and answers 400 to any other name
        # (cli/serving/utils.py _resolve_model); its /v1/models answers 500 with a pinned model, so rig is told.
        url, model = server.url, str(tiny_model_dir)
    else:
        url, model = request.getfixturevalue("vllm_servers").get(0).url, SERVED_NAME
    out = tmp_path_factory.mktemp(f"{engine}-{api}")
    spec = {
        "server": {"engine": "external", "url": url, "model": model},
        "steps": [0],
        "workloads": [
            {"name": "greedy", "max_tokens": MAX_TOKENS},
            {"name": "realistic", "max_tokens": MAX_TOKENS, "chat_prompt_tokens": SHORT, "code_prompt_tokens": SHORT},
        ],
        "load": {"api": api, "concurrency": LEVELS, "requests": REQUESTS, "warmup_requests": 1},
    }
    f = out / "spec.yaml"
    f.write_text(yaml.safe_dump(spec))
    proc = subprocess.run(
        [sys.executable, "-m", "rig.cli", "sweep", "--config", str(f), "--out", str(out), "--run-id", "r", "-q"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return engine, api, out / "r"


def test_no_failed_request_on_any_route(engine_run):
    engine, api, run = engine_run
    m = read_manifest(run)
    t = read_requests(run).to_pandas()
    assert m["status"] == "complete" and len(m["points"]) == 2 * len(LEVELS)
    assert len(t) == 2 * len(LEVELS) * REQUESTS and t.ok.all(), t[~t.ok].error.unique()
    assert (t.api == api).all() and set(t.workload) == {"greedy", "realistic"}
    assert_accounting(run)
    (cfg,) = m["server_configs"].values()
    # the dialect each server was measured in: transformers serve is identified by nothing, so plain OpenAI (it
    # refuses every other field with 422); vLLM answers /version as only vLLM does
    expected = ("plain", "default") if engine == "tserve" else ("vllm", "probe:/version")
    assert (cfg["dialect"], cfg["dialect_source"]) == expected


def test_completion_tokens_are_the_servers_own_count(engine_run):
    engine, _, run = engine_run
    m = read_manifest(run)
    t = read_requests(run).to_pandas()
    assert (t.completion_tokens_source == "usage").all()  # the server's usage, never counted chunks
    assert (t.completion_tokens <= MAX_TOKENS).all() and (t.completion_tokens > 0).all()
    # a stream's chunks never carry more tokens than the server says it generated
    assert (t.chunk_tokens.apply(sum) <= t.completion_tokens).all()
    if engine == "vllm":  # the server's own counter rose by exactly the Parquet's tokens, point by point
        for p in m["points"]:
            rows = t[t.point == p["point"]]
            assert rows.completion_tokens.sum() == p["server_counters_delta"]["vllm:generation_tokens_total"]
    else:
        # transformers serve has no /metrics (404): its count is the usage on the final chunk, streamer.total_tokens
        # (cli/serving/completion.py, chat_completion.py). It stops at max_new_tokens = max_tokens and calls that
        # "length": rows ending on length carry exactly the limit.
        length = t[t.finish_reason == "length"]
        assert len(length) > 0 and (length.completion_tokens == MAX_TOKENS).all()
        assert all(not p["server_counters_delta"] for p in m["points"])
        info = json.dumps(next(iter(m["server_configs"].values()))["info"])
        assert "/v1/models" in info  # recorded (500 from transformers serve with a pinned model)
