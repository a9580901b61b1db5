"""rig prove's verdict and its schedule in SGLang's words, on synthetic runs shaped like the reference campaign
(steps 4 best up to C=32, steps 3 at C=64): an arm that runs the best steps of every band is as good as the best
static setting everywhere; one that stays at steps 4 is worse at C=64; one slower everywhere is worse everywhere."""

from __future__ import annotations

import json

import pytest
from synthetic import CAMPAIGN_TPOT, campaign_run

from rig.analysis.engine_schedule import schedule_slots, sglang_adaptive_config
from rig.analysis.prove import judge_arms, prove_table, summarize
from rig.analysis.report import build_report
from rig.contracts import ProveArm, ProveSection, ScheduleSlot

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


def test_the_schedule_becomes_sglang_slots_keyed_by_the_running_batch(report):
    slots, note = schedule_slots(report, "greedy")
    # steps 4 up to C=32, steps 3 from C=64; no server gauges in this run, so the offered load stands in
    assert [(s.batch_size, s.steps) for s in slots] == [(1, 4), (64, 3)]
    assert "the offered load stands in" in (note or "")
    cfg = sglang_adaptive_config(slots)
    assert cfg == {"1": {"candidate_steps": [4]}, "64": {"candidate_steps": [3]}}
    json.dumps(cfg)  # what SGLang's json.load reads


def test_slots_follow_the_running_batch_and_skip_levels_the_server_capped():
    from types import SimpleNamespace

    def row(point, level, steps):
        return SimpleNamespace(point=point, workload="w", load_mode="closed", concurrency=level, steps=steps)

    bands = [
        {"level": 1, "best_steps": 4},
        {"level": 16, "best_steps": 3},
        {"level": 32, "best_steps": 1},  # the server capped its batch at 12: 32 runs as 16 did
        {"level": 64, "best_steps": 0},
    ]
    campaign = [row("a", 1, 4), row("b", 16, 3), row("c", 32, 1), row("d", 64, 0)]
    server = [
        SimpleNamespace(point="a", running_mean=1.0),
        SimpleNamespace(point="b", running_mean=12.4),
        SimpleNamespace(point="c", running_mean=12.0),
        SimpleNamespace(point="d", running_mean=40.2),
    ]
    report = SimpleNamespace(schedule=[{"workload": "w", "load_mode": "closed", "bands": bands}],
                             campaign=campaign, server=server)  # fmt: skip
    slots, note = schedule_slots(report, "w")  # type: ignore[arg-type]
    assert slots == [
        ScheduleSlot(batch_size=1, steps=4, level=1, running_mean=1.0),
        ScheduleSlot(batch_size=12, steps=3, level=16, running_mean=12.4),
        ScheduleSlot(batch_size=40, steps=0, level=64, running_mean=40.2),
    ]
    assert note == "slots keyed by the running batch the server reported at each band's level"
