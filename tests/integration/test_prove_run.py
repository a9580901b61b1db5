"""`rig prove` end to end on the embedded default: every arm launched and measured on the same requests, the
schedule handed to the server as an SGLang adaptive config file, and each band judged (bookkeeping, not speed);
then `rig prove --from` that proof across load changes: its arms on one profiled point each, judged per phase."""

from __future__ import annotations

import json
import re

import pytest
from accounting import assert_accounting
from support import DATA, rig

from rig.analysis.frontier import valid
from rig.analysis.report import build_report
from rig.results import read_manifest, read_requests

pytestmark = pytest.mark.ray

LEVELS = (1, 8)


def _prove(out, run_id: str, *args: str):
    """rig prove with ``args`` on the test's light greedy workload, into ``out/run_id``; it must succeed."""
    proc = rig(
        "prove",
        *args,
        "--workload",
        "greedy",
        "--workload-opt",
        "max_tokens=24",
        "--warmup",
        "0",
        "--out",
        str(out),
        "--run-id",
        run_id,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def proof(tmp_path_factory):
    out = tmp_path_factory.mktemp("prove")
    proc = _prove(out, "p", "--steps", "2", "--concurrency", ",".join(map(str, LEVELS)), "--requests", "8")
    return out / "p", proc


def test_every_arm_runs_on_the_same_requests_at_every_level(proof):
    run, _ = proof
    m = read_manifest(run)
    arms = m["prove"]["arms"]
    kinds = [a["kind"] for a in arms]
    assert kinds[:2] == ["static", "static"] and kinds[-1] == "adaptive" and set(kinds[2:-1]) <= {"schedule"}
    assert [a["steps"] for a in arms if a["kind"] == "static"] == [0, 2]  # steps 0 always added
    assert m["status"] == "complete" and all(p["status"] == "complete" for p in m["points"])
    configs = {a["server_config"]: a for a in arms}
    assert {p["server_config"] for p in m["points"]} == set(configs)  # one server per arm, each at every level
    t = read_requests(run).to_pandas()
    assert t.ok.all()
    assert_accounting(run)
    for level in LEVELS:
        ids = {cfg: set(g.request_id) for cfg, g in t[t.concurrency == level].groupby("server_config")}
        assert len(ids) == len(arms) and len({frozenset(v) for v in ids.values()}) == 1, level  # paired


def test_the_schedule_and_the_adaptive_arm_are_launched_in_sglangs_words(proof):
    run, _ = proof
    m = read_manifest(run)
    prove = m["prove"]
    by_kind = {a["kind"]: a for a in prove["arms"]}
    commands = {k: " ".join(c["command"]) for k, c in m["server_configs"].items()}
    adaptive = by_kind["adaptive"]
    assert "--speculative-adaptive" in commands[adaptive["server_config"]]
    assert "--speculative-adaptive-config" not in commands[adaptive["server_config"]]  # SGLang's default table
    best = {b["level"]: b["best_static_steps"] for b in prove["bands"]}
    # a level whose static points were all flagged invalid (a busy machine makes the simulator fall behind:
    # sim_behind) has no best setting; the schedule is read off the decided levels only, and proves nothing there
    decided = {level: steps for level, steps in best.items() if steps is not None}
    if len(decided) < len(best):
        assert "in every band" not in prove["verdict"], prove["verdict"]  # a band went unjudged: never "every band"
    if "schedule" not in by_kind:  # one static setting is best in every decided band: the schedule is that setting
        assert len(set(decided.values())) <= 1 or len(prove["schedule"]) == 1, (best, prove["schedule"])
        assert "no schedule arm" in prove["schedule_note"]
        return
    sched = by_kind["schedule"]
    cfg = json.loads((run / sched["config_file"]).read_text())  # the file the server was launched with
    assert cfg and all(len(v["candidate_steps"]) == 1 for v in cfg.values())  # one candidate per slot
    assert "--speculative-adaptive-config" in commands[sched["server_config"]]
    assert sched["config_file"] in commands[sched["server_config"]]


def test_each_band_judges_every_arm_against_the_best_static_setting(proof):
    run, proc = proof
    prove = read_manifest(run)["prove"]
    static = {a["label"]: a["steps"] for a in prove["arms"] if a["kind"] == "static"}
    static_cfg = {a["server_config"]: a["steps"] for a in prove["arms"] if a["kind"] == "static"}
    others = {a["label"] for a in prove["arms"] if a["kind"] != "static"}
    arm_cfg = {a["label"]: a["server_config"] for a in prove["arms"]}
    t = read_requests(run).to_pandas()
    # a point flagged invalid (a busy client machine makes the simulator fall behind: sim_behind) is left out of
    # the ranking, as the report leaves it out; which points those are is the report's call, read from it here
    rows = {(r.server_config, r.level): r for r in build_report(run, cdf_resolution=0).campaign}
    assert [b["level"] for b in prove["bands"]] == list(LEVELS)
    for b in prove["bands"]:
        at = t[t.concurrency == b["level"]]
        statics = {}
        for cfg, g in at.groupby("server_config"):
            if cfg not in static_cfg:
                continue
            # the figure ranked is the point's tokens per second of wall time, recomputed here from its records
            tok_s = g.completion_tokens.sum() / (g.end_ts.max() - g.send_ts.min())
            assert rows[(cfg, b["level"])].aggregate_tok_s == pytest.approx(tok_s, rel=1e-3)
            if valid(rows[(cfg, b["level"])]):
                statics[static_cfg[cfg]] = tok_s
        if not statics:  # every static point at this level was invalid: nothing to judge against
            assert b["best_static"] is None and set(b["arms"]) == others, b
            assert all(r["verdict"] == "not measured" for r in b["arms"].values()), b
            continue
        assert static[b["best_static"]] == b["best_static_steps"]
        assert b["best_static_steps"] == max(statics, key=statics.__getitem__)
        assert set(b["arms"]) == others
        for name, r in b["arms"].items():
            if not valid(rows[(arm_cfg[name], b["level"])]):  # the arm's own point flagged: nothing to judge there
                assert r["verdict"] == "not measured", (b["level"], name, r)
                continue
            assert r["verdict"] in ("better", "as good", "worse", "undecided"), (b["level"], name, r)
            assert r["ci_low"] <= r["margin"] <= r["ci_high"], (b["level"], name, r)
    assert "rig prove: each arm against the best static" in proc.stdout


# --- across load changes: rig prove --from RUN --load-profile PROFILE, on top of the proof above -------------------

PROFILE = "1:1s,8:1s,1:1s"  # short phases (the steady span starts after the first running-gauge sample)
PHASES = [(1, 0.0, 1.0), (8, 1.0, 1.0), (1, 2.0, 1.0)]  # (concurrency, start_s, duration_s)
SCHEDULE = "prove/sglang_adaptive_config.json"  # where a proof keeps its schedule arm's config (rig.tune.prove)


def _with_a_schedule_arm(run, at):
    """The proof at ``run`` as ``at``, with a schedule arm if it had none: on the simulator one setting is usually
    the best at both levels (no schedule arm), and the arm whose config file --from copies is the one to check. The
    arm is the one a proof whose bands differ writes (steps 2 from batch 1, steps 1 from batch 4, its startup steps
    the largest); --from reads only the earlier manifest and that file."""
    m = read_manifest(run)
    if any(a["kind"] == "schedule" for a in m["prove"]["arms"]):
        return run
    (at / "prove").mkdir(parents=True)
    (at / SCHEDULE).write_text(json.dumps({"1": {"candidate_steps": [2]}, "4": {"candidate_steps": [1]}}, indent=2))
    schedule = {"label": "schedule", "kind": "schedule", "server_config": "sim-s2-schedule", "steps": 2}
    m["prove"]["arms"].insert(-1, {**schedule, "config_file": SCHEDULE})  # before the adaptive arm, as prove puts it
    m["prove"]["schedule"] = [
        {"batch_size": 1, "steps": 2, "level": 1.0, "running_mean": 1.0},
        {"batch_size": 4, "steps": 1, "level": 8.0, "running_mean": 6.0},
    ]
    (at / "manifest.json").write_text(json.dumps(m, indent=2))
    return at


@pytest.fixture(scope="module")
def across(proof, tmp_path_factory):
    run, _ = proof
    earlier = _with_a_schedule_arm(run, tmp_path_factory.mktemp("earlier") / "p")
    out = tmp_path_factory.mktemp("across")
    proc = _prove(out, "q", "--from", str(earlier), "--load-profile", PROFILE)
    return earlier, out / "q", proc


def test_across_load_changes_runs_every_arm_of_the_earlier_proof_on_one_profiled_point(across):
    earlier, run, _ = across
    before, m = read_manifest(earlier)["prove"], read_manifest(run)
    prove = m["prove"]
    assert m["status"] == "complete" and prove["profile"] == PROFILE and prove["settings"]["from_run"] == str(earlier)
    same = [(a["label"], a["kind"], a["steps"], a["config_file"]) for a in before["arms"]]
    assert [(a["label"], a["kind"], a["steps"], a["config_file"]) for a in prove["arms"]] == same
    assert {a["kind"] for a in prove["arms"]} == {"static", "schedule", "adaptive"}
    assert [a["steps"] for a in prove["arms"] if a["kind"] == "static"] == [0, 2]  # the earlier statics, not a default
    assert prove["schedule"] == before["schedule"]
    for old, new in zip(before["arms"], prove["arms"], strict=True):  # statics and adaptive: the same servers
        if new["kind"] != "schedule":
            assert new["server_config"] == old["server_config"], new
    # one point per arm, its load the profile's phases
    arm_cfgs = [a["server_config"] for a in prove["arms"]]
    assert sorted(p["server_config"] for p in m["points"]) == sorted(arm_cfgs)
    for p in m["points"]:
        assert p["status"] == "complete" and "-profile-" in p["point"], p["point"]
        assert [(ph["concurrency"], ph["start_s"], ph["duration_s"]) for ph in p["phases"]] == PHASES
    t = read_requests(run).to_pandas()
    assert t.ok.all()
    assert_accounting(run)
    for cfg, g in t.groupby("server_config"):  # the arms share request ids (the same seed): paired, not unique
        assert g.request_id.is_unique and set(g.phase) == {0, 1, 2}, cfg
        assert set(g.concurrency) == {8}  # every record carries the point's level: the profile's peak
    # the schedule arm runs a copy of the earlier file, kept in this run; the adaptive arm SGLang's default table
    by_kind = {a["kind"]: a for a in prove["arms"]}
    commands = {k: c["command"] for k, c in m["server_configs"].items()}
    copied = run / SCHEDULE
    assert copied.read_bytes() == (earlier / SCHEDULE).read_bytes()
    sched = commands[by_kind["schedule"]["server_config"]]
    assert sched[sched.index("--speculative-adaptive-config") + 1] == str(copied)
    assert "--speculative-num-steps" in sched and sched[sched.index("--speculative-num-steps") + 1] == "2"
    adaptive = commands[by_kind["adaptive"]["server_config"]]
    assert "--speculative-adaptive" in adaptive and "--speculative-adaptive-config" not in adaptive
    # a queue note names only levels the profile runs (it named the unused default list: 16, 32, 64)
    for cfg in m["server_configs"].values():
        for w in cfg.get("warnings") or []:
            named = re.search(r"concurrency ([\d, ]+) exceeds", w)
            assert named is None or {int(c) for c in named[1].split(",")} <= {8}, w


def _margin_verdict(margin, tolerance):
    return "better" if margin > tolerance else "as good" if margin >= -tolerance else "worse"


def test_each_phase_and_the_whole_profile_judge_every_arm_against_the_best_static_arm(across):
    _, run, proc = across
    prove = read_manifest(run)["prove"]
    tol = prove["settings"]["tolerance"]
    statics = {a["label"]: a["steps"] for a in prove["arms"] if a["kind"] == "static"}
    others = [a["label"] for a in prove["arms"] if a["kind"] != "static"]
    label_of = {a["server_config"]: a["label"] for a in prove["arms"]}
    report = build_report(run, cdf_resolution=0)
    # a point a busy host flagged invalid (sim_behind) is 'not measured' wherever its arm is judged; which points
    # those are is the report's call, read from it here
    row = {label_of[r.server_config]: r for r in report.campaign}
    phases_of = {
        label_of[r.server_config]: tl.phases for r in report.campaign for tl in report.timelines if tl.point == r.point
    }
    phases = [b for b in prove["phases"] if b["load_mode"] == "profile phase"]
    (whole,) = [b for b in prove["phases"] if b["load_mode"] == "profile"]
    assert prove["phases"][-1] is whole and len(prove["phases"]) == len(PHASES) + 1
    assert [(b["phase"], b["label"]) for b in phases] == [(0, "1:1s"), (1, "8:1s"), (2, "1:1s")]
    for b in phases:
        assert list(b["arms"]) == others, b  # every arm in every phase, judged or 'not measured'
        # each arm's steady-state output tok/s of the phase, from the report's timeline of its own point
        tok_s = {lab: (ph[b["phase"]].output_tok_s if valid(row[lab]) else None) for lab, ph in phases_of.items()}
        measured = {lab: v for lab, v in tok_s.items() if lab in statics and v is not None}
        if not measured:  # every static point flagged (or without a steady span): nothing to judge against
            assert b["best_static"] is None, b
            assert all(r["verdict"] == "not measured" for r in b["arms"].values()), b
            continue
        best = max(measured, key=measured.__getitem__)
        assert (b["best_static"], b["best_static_steps"]) == (best, statics[best]), b
        assert b["best_static_value"] == pytest.approx(measured[best])
        for lab, r in b["arms"].items():
            where = (b["label"], lab, r)
            if tok_s[lab] is None:  # the arm's own point flagged (or no steady span): no number
                assert r["verdict"] == "not measured" and r["value"] is None and r["margin"] is None, where
                continue
            assert r["value"] == pytest.approx(tok_s[lab]), where
            assert r["margin"] == pytest.approx(tok_s[lab] / measured[best] - 1), where
            if r["ci_low"] is None:  # one-second phases: fewer steady windows than an interval needs
                assert r["ci_method"].startswith("margin against the tolerance"), where
                assert r["verdict"] == _margin_verdict(r["margin"], tol), where
            else:
                assert r["ci_method"].startswith("paired windows"), where
                assert r["verdict"] in ("better", "as good", "worse", "undecided"), where
    # the whole profile: one band over each arm's one point, aggregate tok/s, the paired interval over its requests
    assert whole["label"] == "whole profile" and whole["level"] == 8
    ranked = {lab: row[lab].aggregate_tok_s for lab in statics if valid(row[lab])}
    if not ranked:
        assert whole["best_static"] is None and all(r["verdict"] == "not measured" for r in whole["arms"].values())
    else:
        assert whole["best_static_steps"] == statics[max(ranked, key=ranked.__getitem__)]
        assert set(whole["arms"]) == set(others)
        for lab, r in whole["arms"].items():
            if not valid(row[lab]):
                assert r["verdict"] == "not measured", (lab, r)
                continue
            assert r["verdict"] in ("better", "as good", "worse", "undecided"), (lab, r)
            assert r["ci_method"] == "paired requests" and r["ci_low"] <= r["margin"] <= r["ci_high"], (lab, r)
    # the verdict: one line per arm, ending with its verdict over the whole profile
    lines = prove["verdict"].splitlines()
    assert [line.split(":")[0] for line in lines] == others
    for lab, line in zip(others, lines, strict=True):
        r = whole["arms"].get(lab)
        assert (f"whole profile {r['verdict']}" if r else "whole profile not measured") in line, line
        worse = [b["label"] for b in phases if b["arms"][lab]["verdict"] == "worse"]
        behind = "behind the best static setting in phase(s) " + ", ".join(worse)
        assert (behind in line) if worse else ("behind" not in line), line
    assert "rig prove across load changes (" + PROFILE + ")" in proc.stdout


def _pct(v):
    return "" if v is None else f"{v * 100:+.1f}%"


def _cell(r):
    """An arm's verdict cell as the proof's table writes it (rig.analysis.prove.prove_table)."""
    ci = f" [{_pct(r['ci_low'])}, {_pct(r['ci_high'])}]" if r["ci_low"] is not None else ""
    return f"{_pct(r['margin'])}{ci} {r['verdict']}".strip()


def test_the_report_of_the_run_shows_its_phase_verdicts(across):
    _, run, _ = across
    prove = read_manifest(run)["prove"]
    shown = rig("report", str(run))
    assert shown.returncode == 0, shown.stderr
    assert "rig prove across load changes (" + PROFILE + ")" in shown.stdout
    assert " ".join(prove["verdict"].split()) in " ".join(shown.stdout.split())  # the caption, however it wraps
    rows = [line for line in shown.stdout.splitlines() if re.match(r"│ greedy +│ (\d+:1s|whole profile) ", line)]
    assert len(rows) == len(prove["phases"]), shown.stdout[-4000:]
    for line, b in zip(rows, prove["phases"], strict=True):
        assert b["label"] in line
        for r in b["arms"].values():
            assert _cell(r) in line, (line, r)
    full = rig("report", str(run), "--json-full")
    assert full.returncode == 0, full.stderr
    carried = json.loads(full.stdout)["prove"]
    assert carried["phases"] == prove["phases"] and carried["verdict"] == prove["verdict"]
    assert carried["profile"] == PROFILE and carried["arms"] == prove["arms"]


def test_from_a_run_that_is_no_proof_or_without_a_profile_is_one_line(proof):
    run, _ = proof
    sweep = DATA / "golden" / "run"  # a plain sweep: its manifest has no prove section
    for args, says in (
        (["--from", str(sweep), "--load-profile", PROFILE], f"{sweep} is not a rig prove run"),
        (["--from", str(run)], "--from RUN proves across load changes: give --load-profile"),
    ):
        proc = rig("prove", *args, "--out", str(run.parent / "never"), timeout=60)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
        assert "Traceback" not in proc.stderr + proc.stdout
        assert not (run.parent / "never").exists()
