"""The manifests of rig prove on real SGLang 0.5.17 (H100, 2026-12-07; tests/data/h100-2026-12-07-pm and
docs/benchmarks.md): they parse with rig's contracts, and what they record is what the docs say was found there."""

from __future__ import annotations

import gzip
import json

from support import DATA

from rig.analysis.prove import summarize
from rig.contracts import parse_manifest

PM = DATA / "h100-2026-12-07-pm"


def _manifest(name: str):
    return parse_manifest(gzip.decompress((PM / name).read_bytes()).decode(), name)


def test_the_proof_on_sglang_recorded_its_arms_schedule_and_verdicts():
    m = _manifest("prove_manifest.json.gz")
    assert m.status == "complete" and len(m.points) == 28
    prove = m.prove
    assert prove is not None
    assert [(a.kind, a.steps) for a in prove.arms] == [
        ("static", 0),
        ("static", 1),
        ("static", 2),
        ("static", 3),
        ("static", 4),
        ("schedule", 4),
        ("adaptive", 7),
    ]
    assert [(s.batch_size, s.steps) for s in prove.schedule] == [(1, 4), (2, 0)]
    config = json.loads((PM / "sglang_adaptive_config.json").read_text())
    assert {k: v["candidate_steps"] for k, v in config.items() if k.isdigit()} == {"1": [4], "2": [0]}
    verdicts = {(b.level, arm): r.verdict for b in prove.bands for arm, r in b.arms.items()}
    assert {lvl: verdicts[(lvl, "schedule")] for lvl in (4.0, 16.0, 64.0)} == dict.fromkeys((4.0, 16.0, 64.0), "worse")
    assert {verdicts[(lvl, "adaptive")] for lvl in (1.0, 4.0, 16.0, 64.0)} == {"worse"}
    assert verdicts[(1.0, "schedule")] == "undecided"
    assert "schedule: worse than the best static setting at level(s) 4, 16, 64" in summarize(prove)
    # every server under speculation held 48 running requests; the plain one 4,096 (SGLang's own startup log)
    limits = {c.knobs["steps"]: (c.startup or {}).get("max_running_requests") for c in m.server_configs.values()}
    assert limits == {0: 4096, 1: 48, 2: 48, 3: 48, 4: 48, 7: 48}


def test_the_proof_across_load_changes_judged_each_phase():
    m = _manifest("prove_profile_manifest.json.gz")
    prove = m.prove
    assert prove is not None and prove.profile == "1:20s,64:20s,1:20s" and len(m.points) == 4
    assert all("-profile-" in p.point for p in m.points)
    by_phase = {b.phase: b for b in prove.phases}  # the phases, then the whole profile (phase None)
    assert [by_phase[i].best_static for i in (0, 1, 2, None)] == ["steps 3", "steps 0", "steps 3", "steps 3"]
    verdicts = {i: {a: r.verdict for a, r in by_phase[i].arms.items()} for i in by_phase}
    assert verdicts == {
        0: {"schedule": "better", "adaptive": "not measured"},  # the controller's tier never settled in that phase
        1: {"schedule": "worse", "adaptive": "worse"},
        2: {"schedule": "better", "adaptive": "worse"},
        None: {"schedule": "worse", "adaptive": "worse"},
    }


def test_the_second_proof_on_both_workloads_found_no_schedule_to_prove():
    """The evening's proof (models trained again; greedy and realistic): steps 0 was the best static setting in
    every band, so rig measured no schedule arm, and SGLang's adaptive controller was worse in all eight bands."""
    eve = DATA / "h100-2026-12-07-eve"
    m = parse_manifest(gzip.decompress((eve / "prove_manifest.json.gz").read_bytes()).decode(), "prove")
    assert m.status == "complete" and len(m.points) == 48
    prove = m.prove
    assert prove is not None
    assert [(a.kind, a.steps) for a in prove.arms] == [("static", s) for s in range(5)] + [("adaptive", 7)]
    assert [(s.batch_size, s.steps) for s in prove.schedule] == [(1, 0)]
    bands = {(b.workload, b.level): b for b in prove.bands}
    assert sorted(bands) == [(w, lvl) for w in ("greedy", "realistic") for lvl in (1.0, 4.0, 16.0, 64.0)]
    assert {b.best_static for b in bands.values()} == {"steps 0"}
    assert {b.arms["adaptive"].verdict for b in bands.values()} == {"worse"}
    assert all(b.arms["adaptive"].ci_high < -0.15 for b in bands.values())  # at least 15 % slower, every band
