"""Engine adapters: exact argv per engine and steps, startup-log parsing, counter-window acceptance."""

import json
import sys

import pytest

from rig.server.engines import engine_for
from rig.server.spec import ServerConfig


def test_sglang_argv_steps_4_matches_the_campaign_flags():
    cfg = ServerConfig(
        engine="sglang",
        model="/models/qwen",
        tp=4,
        steps=4,
        python="/venv/bin/python",
        extra_args=("--mem-fraction-static", "0.85"),
    )
    argv = engine_for("sglang").argv(cfg, "10.0.0.5", 30000)
    assert argv == [
        "/venv/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/qwen",
        "--tp-size",
        "4",
        "--host",
        "10.0.0.5",
        "--port",
        "30000",
        "--enable-metrics",
        "--enable-cache-report",
        "--speculative-algorithm",
        "NEXTN",
        "--speculative-num-steps",
        "4",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "5",
        "--mem-fraction-static",
        "0.85",
    ]


def test_sglang_and_sim_ask_for_the_cache_report():
    """cached_tokens on SGLang's OpenAI routes is null without --enable-cache-report
    (entrypoints/openai/usage_processor.py); the vLLM adapter passes its equivalent, so must this one."""
    for engine in ("sglang", "sim"):
        argv = engine_for(engine).argv(ServerConfig(engine=engine, steps=0), "h", 1)
        assert argv.count("--enable-cache-report") == 1


def test_steps_0_means_no_speculation_and_sim_uses_rig_python():
    cfg = ServerConfig(engine="sim", steps=0)
    argv = engine_for("sim").argv(cfg, "0.0.0.0", 1234)
    assert argv[:3] == [sys.executable, "-m", "rig.sim"]
    assert not any(a.startswith("--speculative") for a in argv)


def test_sglang_tree_and_standalone_draft():
    cfg = ServerConfig(
        engine="sglang", steps=3, eagle_topk=4, num_draft_tokens=8, spec_algorithm="standalone", draft_model_path="/d"
    )
    argv = engine_for("sglang").argv(cfg, "h", 1)
    i = argv.index("--speculative-algorithm")
    assert argv[i : i + 4] == ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "/d"]
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "8"
    assert argv[argv.index("--speculative-eagle-topk") + 1] == "4"


def test_standalone_without_draft_is_rejected():
    with pytest.raises(ValueError, match="draft_model_path"):
        ServerConfig(engine="sglang", steps=2, spec_algorithm="STANDALONE")


def test_vllm_speculative_config_json():
    cfg = ServerConfig(engine="vllm", model="/tiny", tp=1, steps=2, spec_method="ngram", device="cpu")
    argv = engine_for("vllm").argv(cfg, "127.0.0.1", 8000)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] == 2
    assert engine_for("vllm").num_gpus(cfg) == 0
    assert "--speculative-config" not in engine_for("vllm").argv(cfg.model_copy(update={"steps": 0}), "h", 1)


def test_sglang_startup_line_parsed():
    log = (
        "[2026-01-01 10:00:00 TP0] Load weight end.\n[2026-01-01 10:00:05 TP0] max_total_num_tokens=412345, "
        "chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=48, context_len=262144, "
        "available_gpu_mem=12.34 GB\n"
    )
    assert engine_for("sglang").parse_startup_log(log) == {
        "max_total_num_tokens": 412345,
        "chunked_prefill_size": 8192,
        "max_prefill_tokens": 16384,
        "max_running_requests": 48,
        "context_len": 262144,
        "available_mem_gb": 12.34,
    }
    assert engine_for("sglang").parse_startup_log("nothing here") == {}


def test_window_acceptance_from_counter_deltas():
    sg = engine_for("sglang").window_acceptance(
        {"sglang:generation_tokens_total": 100, "sglang:spec_verify_calls_total": 50},
        {"sglang:generation_tokens_total": 1100, "sglang:spec_verify_calls_total": 350},
    )
    assert sg.accept_length == pytest.approx(1000 / 300)
    vl = engine_for("vllm").window_acceptance(
        {
            "vllm:spec_decode_num_drafts_total": 10,
            "vllm:spec_decode_num_accepted_tokens_total": 5,
            "vllm:spec_decode_num_draft_tokens_total": 40,
        },
        {
            "vllm:spec_decode_num_drafts_total": 54,
            "vllm:spec_decode_num_accepted_tokens_total": 158,
            "vllm:spec_decode_num_draft_tokens_total": 196,
        },
    )
    assert vl.accept_length == pytest.approx(1 + 153 / 44)
    assert vl.accept_rate == pytest.approx(153 / 156)
    assert engine_for("sglang").window_acceptance({}, {}) is None


def test_unknown_engine():
    with pytest.raises(ValueError, match="unknown engine"):
        engine_for("tgi")


def test_config_id_is_stable_and_distinguishes_knobs():
    a = ServerConfig(engine="sim", steps=2)
    assert a.config_id() == ServerConfig(engine="sim", steps=2).config_id()
    assert a.config_id() != ServerConfig(engine="sim", steps=2, eagle_topk=2).config_id()
    assert a.config_id().startswith("sim-s2-")
