"""rig prove's verdict and its schedule in SGLang's words, on synthetic runs shaped like the reference campaign
(steps 4 best up to C=32, steps 3 at C=64): an arm that runs the best steps of every band is as good as the best
static setting everywhere; one that stays at steps 4 is worse at C=64; one slower everywhere is worse everywhere."""

from __future__ import annotations

import json

import pytest
from synthetic import CAMPAIGN_TPOT, campaign_run

from rig.analysis.prove import judge_arms, prove_table, schedule_slots, summarize
from rig.analysis.report import build_report
from rig.contracts import ProveArm, ProveSection

BEST = {c: min(CAMPAIGN_TPOT[s][c] for s in CAMPAIGN_TPOT) for c in CAMPAIGN_TPOT[4]}  # the best static per level


def _section() -> ProveSection:
    arms = [ProveArm(label=f"steps={s}", kind="static", server_config=f"cfg{s}", steps=s) for s in CAMPAIGN_TPOT]
    arms += [
        ProveArm(label="schedule", kind="schedule", server_config="cfgS", steps=4),
        ProveArm(label="adaptive", kind="adaptive", server_config="cfgA", steps=4),
        ProveArm(label="slow", kind="adaptive", server_config="cfgX", steps=4),
    ]
    return ProveSection(arms=arms)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    arms = {
        "cfgS": (4, dict(BEST)),  # the schedule: each band's best steps
        "cfgA": (4, dict(CAMPAIGN_TPOT[4])),  # adaptive stuck at steps 4
        "cfgX": (4, {c: t * 1.3 for c, t in BEST.items()}),  # 30 % slower everywhere
    }
    run = campaign_run(tmp_path_factory.mktemp("prove") / "run", arms=arms)
    return build_report(run, cdf_resolution=0)


def test_each_arm_is_judged_against_the_best_static_setting_per_band(report):
    section = _section()
    judge_arms(section, report)
    bands = {b.level: b for b in section.bands}
    assert [b.level for b in section.bands] == [1, 4, 16, 32, 64]
    assert bands[64].best_static == "steps=3" and bands[1].best_static == "steps=4"
    for b in section.bands:
        sched = b.arms["schedule"]
        assert sched.verdict == "as good" and sched.ci_low > -0.02 and abs(sched.margin) < 0.02, (b.level, sched)
        assert sched.ci_method == "paired requests"
        assert b.arms["slow"].verdict == "worse" and b.arms["slow"].margin == pytest.approx(-0.23, abs=0.03)
    assert bands[64].arms["adaptive"].verdict == "worse"
    assert bands[1].arms["adaptive"].verdict == "as good"
    lines = summarize(section).splitlines()
    assert lines[0] == "schedule: as good as the best static setting in every band (within 2%)"
    assert lines[1].startswith("adaptive: worse than the best static setting at level(s) 64")
    assert lines[2] == "slow: worse than the best static setting at level(s) 1, 4, 16, 32, 64"
    assert prove_table(section).row_count == 5


def test_an_arm_without_a_valid_point_at_a_level_is_not_proved(report):
    section = _section()
    section.arms.append(ProveArm(label="absent", kind="schedule", server_config="cfgNone", steps=4))
    judge_arms(section, report)
    assert all(b.arms["absent"].verdict == "not measured" for b in section.bands)
    assert "absent: not proved (unmeasured or undecided at level(s) 1, 4, 16, 32, 64)" in summarize(section)


def test_a_level_whose_static_points_are_all_invalid_keeps_its_band_and_proves_nothing(report):
    import copy

    statics = {f"cfg{s}" for s in CAMPAIGN_TPOT}
    flagged = copy.copy(report)  # what a busy client machine makes of the simulator's points at C=64: sim_behind
    flagged.campaign = [
        r.model_copy(update={"flags": [*r.flags, "sim_behind"]}) if r.level == 64 and r.server_config in statics else r
        for r in report.campaign
    ]
    section = _section()
    judge_arms(section, flagged)
    bands = {b.level: b for b in section.bands}
    assert [b.level for b in section.bands] == [1, 4, 16, 32, 64]
    assert bands[64].best_static is None and bands[64].best_static_value is None
    assert {k: v.verdict for k, v in bands[64].arms.items()} == dict.fromkeys(
        ("schedule", "adaptive", "slow"), "not measured"
    )
    lines = summarize(section).splitlines()
    # the schedule is as good everywhere it was judged, but a band went unjudged: not proved, never "every band"
    assert lines[0] == "schedule: not proved (unmeasured or undecided at level(s) 64)"
    assert lines[2] == "slow: worse than the best static setting at level(s) 1, 4, 16, 32"


def test_the_schedule_becomes_sglang_slots_keyed_by_the_running_batch(tmp_path):
    from synthetic import write_server_metrics

    run = campaign_run(tmp_path / "run")
    # the server's running batch at each level (what SGLang's router sees): the level itself up to 32, then 40
    for steps in CAMPAIGN_TPOT:
        for c in CAMPAIGN_TPOT[steps]:
            running = min(c, 40)
            write_server_metrics(run, f"s{steps}-c{c}", [
                {"ts": 100.0 + t, "name": "sglang:num_running_reqs", "value": float(running)} for t in range(3)
            ])  # fmt: skip
    slots, config, note = schedule_slots(build_report(run, cdf_resolution=0), "greedy")
    # steps 4 best up to C=32 (batch 32), steps 3 from C=64 (batch 40)
    assert [(s.batch_size, s.steps) for s in slots] == [(1, 4), (40, 3)]
    assert slots[1].level == 64 and slots[1].running_mean == 40.0
    assert config == {"1": {"candidate_steps": [4]}, "40": {"candidate_steps": [3]}}
    assert note.startswith("slots keyed by the running batch")
    json.dumps(config)  # what SGLang's json.load reads


def test_without_a_running_batch_gauge_there_is_no_schedule_to_launch(report):
    slots, config, note = schedule_slots(report, "greedy")
    assert slots == [] and config is None
    assert "no running-batch gauge" in note


def test_each_phase_is_judged_on_its_steady_state_and_the_whole_profile_sums_it_up():
    from rig.analysis.prove import _phase_band, summarize_phases
    from rig.contracts import ArmResult, ProveBand, ProveSettings

    statics = {"steps 0", "steps 4"}
    low = _phase_band("w", 0, "1:60s", {"steps 0": 100.0, "steps 4": 190.0, "adaptive": 187.0}, statics, {}, 0.02)
    high = _phase_band("w", 1, "64:60s", {"steps 0": 900.0, "steps 4": 700.0, "adaptive": 810.0}, statics,
                       {"adaptive": 0.4}, 0.02)  # fmt: skip
    assert (low.best_static, low.best_static_value) == ("steps 4", 190.0)
    assert low.arms["adaptive"].verdict == "as good" and low.arms["adaptive"].margin == pytest.approx(-0.0158, abs=1e-3)
    assert high.best_static == "steps 0" and high.arms["adaptive"].verdict == "worse"
    assert high.arms["adaptive"].steps_mean == 0.4
    whole = ProveBand(workload="w", load_mode="profile", level=64, label="whole profile", best_static="steps 0",
                      arms={"adaptive": ArmResult(value=1.0, margin=-0.05, verdict="worse")})  # fmt: skip
    section = ProveSection(
        settings=ProveSettings(),
        arms=[ProveArm(label="adaptive", kind="adaptive", server_config="a", steps=3)],
        phases=[low, high, whole],
    )
    assert summarize_phases(section) == (
        "adaptive: behind the best static setting in phase(s) 64:60s; whole profile worse (-5.0% vs the best static "
        "setting)"
    )


def test_the_adaptive_arm_starts_where_sglang_would(tmp_path):
    from rig.tune.prove import default_adaptive_steps

    assert default_adaptive_steps(None) == 3  # the middle of 0.5.23's union [0, 1, 3, 5, 7]
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"1": {"candidate_steps": [2, 4]}, "16": {"candidate_steps": [0]}}))
    assert default_adaptive_steps(str(table)) == 2  # union [0, 2, 4]: its middle


def test_a_slot_above_what_the_schedule_server_holds_is_said_to_be_unreachable():
    from types import SimpleNamespace

    from rig.analysis.prove import _unreachable_slots
    from rig.contracts import ScheduleSlot

    section = ProveSection(
        arms=[ProveArm(label="schedule", kind="schedule", server_config="cfgS", steps=4)],
        schedule=[ScheduleSlot(batch_size=1, steps=4, level=1), ScheduleSlot(batch_size=12, steps=2, level=16)],
    )
    configs = {"cfgS": SimpleNamespace(startup={"max_running_requests": 11})}
    report = SimpleNamespace(run=SimpleNamespace(manifest=SimpleNamespace(server_configs=configs)))
    assert _unreachable_slots(section, report) == (  # type: ignore[arg-type]
        "the schedule server holds at most 11 running requests (sized for its startup steps 4): the slot from batch "
        "12 (steps 2) is never reached, so it runs the slot below there"
    )
    configs["cfgS"].startup = {"max_running_requests": 12}
    assert _unreachable_slots(section, report) is None  # type: ignore[arg-type]


def test_no_valid_phase_proves_nothing():
    from rig.analysis.prove import summarize_phases
    from rig.contracts import ProveSettings

    section = ProveSection(
        settings=ProveSettings(), arms=[ProveArm(label="adaptive", kind="adaptive", server_config="a", steps=3)]
    )
    assert summarize_phases(section) == (
        "adaptive: not proved (no valid point to judge a phase on: see the points' flags); whole profile not measured"
    )


def test_prove_takes_several_workloads_as_sweep_does():
    """`--workload greedy,realistic` is two workloads for rig prove as for rig sweep (on the GPU it was refused with
    a validation error, and a repeated --workload kept only the last: the proof ran realistic alone)."""
    from click.testing import CliRunner

    from rig.cli import cli

    result = CliRunner().invoke(
        cli, ["prove", "--workload", "greedy,realistic", "--steps", "2", "--concurrency", "1", "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    points = [ln for ln in result.output.splitlines() if ln.startswith("sim-s") and ln.endswith("-c1")]
    assert sorted(p.split("-", 3)[3] for p in points) == ["greedy-c1", "greedy-c1", "realistic-c1", "realistic-c1"]


def _run_with_running_gauge(tmp_path):
    from synthetic import write_server_metrics

    run = campaign_run(tmp_path / "run")
    for steps in CAMPAIGN_TPOT:
        for c in CAMPAIGN_TPOT[steps]:
            write_server_metrics(run, f"s{steps}-c{c}", [
                {"ts": 100.0 + t, "name": "sglang:num_running_reqs", "value": float(min(c, 40))} for t in range(3)
            ])  # fmt: skip
    return run


def test_on_vllm_the_schedule_is_its_per_batch_size_list(tmp_path):
    """The same bands in vLLM's words: num_speculative_tokens_per_batch_size ranges, the largest K its ceiling."""
    from rig.config import build_spec
    from rig.tune.prove import schedule_arm_config

    slots, config, _ = schedule_slots(
        build_report(_run_with_running_gauge(tmp_path), cdf_resolution=0), "greedy", "vllm"
    )
    assert [(s.batch_size, s.steps) for s in slots] == [(1, 4), (40, 3)]
    assert config is not None and config["num_speculative_tokens"] == 4
    assert config["num_speculative_tokens_per_batch_size"][0][:1] == [1] and [
        r[2] for r in config["num_speculative_tokens_per_batch_size"]
    ] == [4, 3]
    path = tmp_path / "vllm_speculative_config.json"
    path.write_text(json.dumps(config))
    base = build_spec({}, {"server": {"engine": "vllm", "model": "m", "spec_method": "ngram"}, "steps": [0]})
    cfg = schedule_arm_config(base.server_configs()[0], 4, str(path))
    assert cfg.scheduled and cfg.steps == 4 and cfg.config_id().startswith("vllm-sched-")
    assert [list(e) for e in cfg.spec_schedule] == config["num_speculative_tokens_per_batch_size"]


def test_a_vllm_proof_launches_the_schedule_arm_and_says_why_it_has_no_adaptive_one(tmp_path):
    """rig prove --engine vllm: the statics, then the schedule as vLLM's list (kept in the run directory); no
    adaptive arm (vLLM has no controller), and the proof says so instead of leaving it out silently."""
    from types import SimpleNamespace

    from rig.config import build_spec
    from rig.contracts import ProveSettings
    from rig.tune.prove import NO_VLLM_CONTROLLER, VLLM_SCHEDULE_FILE, prove_planner

    run = _run_with_running_gauge(tmp_path)
    server = {"engine": "vllm", "model": "m", "spec_method": "ngram"}
    spec = build_spec(
        {}, {"server": server, "steps": [0, 3, 4], "workloads": [{"name": "greedy"}], "load": {"concurrency": [1, 64]}}
    )
    runner = SimpleNamespace(run_dir=run, manifest=SimpleNamespace(prove=None), save=lambda: None)
    points = list(prove_planner(spec, ProveSettings())(runner))
    section = runner.manifest.prove
    assert [a.kind for a in section.arms] == ["static", "static", "static", "schedule"]
    sched_arm = section.arms[-1]
    assert sched_arm.config_file == VLLM_SCHEDULE_FILE and sched_arm.server_config.startswith("vllm-sched-")
    kept = json.loads((run / VLLM_SCHEDULE_FILE).read_text())
    assert [r[2] for r in kept["num_speculative_tokens_per_batch_size"]] == [4, 3]
    scheduled = [p for p in points if p.server.scheduled]
    assert len(scheduled) == 2 and len(points) == 3 * 2 + 2  # statics at both levels, then the schedule arm's
    assert section.adaptive_note == NO_VLLM_CONTROLLER and not any(a.kind == "adaptive" for a in section.arms)
