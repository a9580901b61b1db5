"""The schedule by running batch, written as vLLM's num_speculative_tokens_per_batch_size and an SGLang adaptive
config, each checked against the engine's own rules."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rig.analysis.cli import report as report_cmd
from rig.analysis.engine_schedule import BatchBand, batch_ranges, time_weighted_mean, vllm_problems
from rig.analysis.report import build_report, full_json
from rig.analysis.server_series import Series
from rig.contracts.adaptive import slot_for_batch, slots_of
from tests.synthetic import CAMPAIGN_TPOT, campaign_run, write_server_metrics

CAP = {1: 60, 2: 50, 3: 40, 4: 30}  # running requests each steps value can hold (speculation costs capacity)


def _band(level: float, steps: int, batch: float | None) -> BatchBand:
    return BatchBand(level=level, best=f"steps={steps}", steps=steps, running_batch=batch, points=[])


def test_ranges_start_at_each_bands_batch_and_merge_equal_steps():
    notes: list[str] = []
    bands = [_band(1, 4, 1.0), _band(4, 4, 3.8), _band(16, 3, 15.6), _band(32, 3, 30.0), _band(64, 0, 41.2)]
    assert batch_ranges(bands, 48, notes) == [[1, 15, 4], [16, 40, 3], [41, 48, 0]] and not notes
    # a band whose batch is not above the one below (the server queued instead): merged, and said
    merged = batch_ranges([_band(32, 4, 30.0), _band(64, 3, 29.5)], 30, notes)
    assert merged == [[1, 30, 4]] and "not above the band below" in notes[0]


def test_vllm_rules():
    assert vllm_problems([[1, 15, 4], [16, 48, 0]]) == []
    assert "must start at 1" in " ".join(vllm_problems([[2, 15, 4]]))
    assert "non-overlapping and sorted" in " ".join(vllm_problems([[1, 15, 4], [10, 20, 3]]))
    assert "start must be <= end" in " ".join(vllm_problems([[1, 15, 4], [20, 16, 3]]))


def test_time_weighted_mean_holds_each_sample_until_the_next():
    import numpy as np

    # 1 for 9 s, then 10 for 1 s (the last sample closes the window): 1.9, not the sample mean 4.0
    s = Series(np.array([0.0, 9.0, 10.0]), np.array([1.0, 10.0, 1.0]))
    assert time_weighted_mean(s) == 1.9


def _run_with_running_gauge(tmp_path):
    run_dir = campaign_run(tmp_path / "run")
    for steps, by_level in CAMPAIGN_TPOT.items():
        for c in by_level:
            gauge = {"name": "sglang:num_running_reqs", "value": float(min(c, CAP[steps]))}
            write_server_metrics(run_dir, f"s{steps}-c{c}", [{**gauge, "ts": 100.0 + i} for i in range(4)])
    return run_dir


def test_report_writes_the_schedule_in_both_engines_words(tmp_path):
    rep = build_report(_run_with_running_gauge(tmp_path))
    [s] = rep.engine_schedule
    # steps 4 is best up to C=32 (a batch of 30, its capacity), steps 3 at C=64 (a batch of 40)
    assert [(b["level"], b["steps"], b["running_batch"]) for b in s["bands"]][-2:] == [(32, 4, 30.0), (64, 3, 40.0)]
    assert s["ranges"] == [[1, 39, 4], [40, 40, 3]]
    vllm = s["vllm_speculative_config"]
    assert vllm is not None and vllm["num_speculative_tokens"] == 4
    assert vllm_problems(vllm["num_speculative_tokens_per_batch_size"]) == []
    sgl = s["sglang_adaptive_config"]
    assert sgl == {"1": {"candidate_steps": [4]}, "40": {"candidate_steps": [3]}}
    slots = slots_of(sgl)  # SGLang's own checks pass, and a batch routes to the range's steps
    assert [slots[slot_for_batch(b, slots)] for b in (1, 39, 40, 64)] == [[4], [4], [3], [3]]
    assert "--speculative-num-steps 4" in str(s["sglang_command"]) and "--speculative-adaptive-config" in str(
        s["sglang_command"]
    )
    assert "num_speculative_tokens_per_batch_size" in str(s["vllm_command"])
    assert full_json(rep)["engine_schedule"] == rep.engine_schedule


def test_engine_schedule_flag_writes_the_files(tmp_path):
    run_dir = _run_with_running_gauge(tmp_path)
    out = tmp_path / "engine"
    res = CliRunner().invoke(report_cmd, [str(run_dir), "--engine-schedule", str(out)])
    assert res.exit_code == 0, res.output
    assert "Schedule by running batch" in res.output
    vllm = json.loads((out / "greedy-closed.vllm-speculative-config.json").read_text())
    assert vllm["num_speculative_tokens_per_batch_size"] == [[1, 39, 4], [40, 40, 3]]
    assert json.loads((out / "greedy-closed.sglang-adaptive.json").read_text())["40"] == {"candidate_steps": [3]}


def test_without_a_running_gauge_the_bands_cannot_be_given_by_batch(tmp_path):
    rep = build_report(campaign_run(tmp_path / "run"))
    [s] = rep.engine_schedule
    assert s["ranges"] == [] and s["vllm_speculative_config"] is None and "no running-batch gauge" in s["notes"][-1]


def test_the_vllm_config_names_the_runs_speculation_in_vllms_words():
    """A schedule measured on SGLang is written for vLLM with vLLM's method (and draft path where vLLM needs one):
    on the 2026-12-07 H100 sweep (STANDALONE) it said "mtp", which vLLM would load as the target's own MTP head."""
    from rig.analysis.engine_schedule import VLLM_METHOD_OF_SGLANG, _vllm

    ranges = [[1, 1, 4], [2, 4096, 0]]
    config, command = _vllm(ranges, VLLM_METHOD_OF_SGLANG["STANDALONE"], "/models/draft", "/models/target", [])
    assert config == {
        "method": "draft_model",
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": ranges,
        "model": "/models/draft",
    }
    assert command is not None and json.loads(command.split("--speculative-config ", 1)[1].strip("'")) == config
    mtp, _ = _vllm(ranges, VLLM_METHOD_OF_SGLANG["NEXTN"], "/models/draft", "/models/target", [])
    assert mtp is not None and mtp["method"] == "mtp" and "model" not in mtp  # MTP heads live in the target


def test_a_sim_runs_schedule_keeps_mtp_for_nextn(tmp_path):
    rep = build_report(_run_with_running_gauge(tmp_path))
    [s] = rep.engine_schedule
    assert s["vllm_speculative_config"] is not None and s["vllm_speculative_config"]["method"] == "mtp"
