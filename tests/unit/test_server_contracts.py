"""The server actor's typed answers, the effective configuration as older manifests recorded it, and the
placement package's modules (fast: no Ray is started, no server)."""

from __future__ import annotations

import importlib
import inspect
import pickle

from rig.contracts import (
    EffectiveConfig,
    FlushAnswer,
    GpuSamplerStats,
    GpuTelemetry,
    ServerConfigEntry,
    ServerDescription,
    ServerReady,
    ServerStarted,
    WaitProgress,
)
from rig.server.effective import change_lines, label_knobs
from rig.server.engines import engine_for

SGLANG_LOG = (
    "max_total_num_tokens=4096, chunked_prefill_size=2048, max_prefill_tokens=16384, max_running_requests=48, "
    "context_len=8192, available_gpu_mem=12.50 GB"
)


def test_actor_answers_survive_the_trip_through_ray_and_validate_on_the_driver():
    answers = [
        ServerStarted(command=["python", "-m", "rig.sim"], url="http://127.0.0.1:1", node_ip="127.0.0.1", pid=7),
        ServerReady(ready_after_s=1.5, probe="/health"),
        WaitProgress(elapsed_s=3.0, last="HTTP 503 from /health"),
        ServerDescription(
            info={"/server_info": {"tp_size": 1}}, startup=engine_for("sglang").parse_startup_log(SGLANG_LOG)
        ),
        FlushAnswer(status=200, body="ok"),
        GpuTelemetry(source="simulated", gpus=[{"index": 0}], node_ip="127.0.0.1"),
        GpuSamplerStats(source="simulated", samples=3, rows=6, cpu_s=0.01, wall_s=0.02),
    ]
    for sent in answers:
        got = pickle.loads(pickle.dumps(sent))  # what Ray does with an actor's return value
        assert type(sent).model_validate(got) == sent
        assert type(sent).model_validate(sent.model_dump()) == sent  # as a plain dict (an older actor) too


def test_startup_facts_keep_the_log_parsers_keys_and_order():
    desc = ServerDescription(startup=engine_for("sglang").parse_startup_log(SGLANG_LOG))
    assert list(desc.startup) == [
        "max_total_num_tokens",
        "chunked_prefill_size",
        "max_prefill_tokens",
        "max_running_requests",
        "context_len",
        "available_mem_gb",
    ]
    assert desc.startup["max_running_requests"] == 48 and desc.startup["available_mem_gb"] == 12.5


def test_an_older_manifests_effective_config_loads_and_is_written_back_as_it_was():
    written = {
        "requested": {"steps": 3, "num_draft_tokens": 8},
        "effective": {"steps": 3, "num_draft_tokens": 4, "spec_algorithm": "EAGLE"},
        "changed": [{"knob": "num_draft_tokens", "requested": 8, "effective": 4}],
        "seeds_honoured": False,
    }
    entry = ServerConfigEntry.model_validate({"engine": "sglang", "effective": written})
    assert isinstance(entry.effective, EffectiveConfig)
    assert entry.model_dump(mode="json")["effective"] == written
    assert label_knobs({"steps": 3, "num_draft_tokens": 8, "extra_args": []}, entry.effective) == {
        "steps": 3,
        "num_draft_tokens": 4,
        "extra_args": [],
    }
    assert change_lines("c1", entry.effective) == ["server c1: requested num_draft_tokens=8 but the server runs 4"]
    # A sparse entry (only what a report needs) loads too; a key this rig does not know is kept.
    sparse = EffectiveConfig.model_validate({"changed": [], "seeds_honoured": True, "note": "kept"})
    assert sparse.seeds_honoured is True and sparse.model_dump()["note"] == "kept"


def test_each_placement_job_is_its_own_module():
    for name in ("connection", "discovery", "plan", "clocks", "node_files", "gather", "errors"):
        mod = importlib.import_module(f"rig.placement.{name}")
        assert inspect.ismodule(mod) and mod.__name__ == f"rig.placement.{name}"
