"""rig tune end to end, through Ray and HTTP, against a simulator whose profile differs from the reference in ways
tune cannot see: every probe is an ordinary complete point of the run with what the model predicted for it, the
rounds end stable, and the recommendation is what `rig report` reads off the run's own points. Whether tune reaches
the exhaustive grid's answer with at most half of its points is checked on the virtual clock, where host load cannot
move the numbers (tests/integration/test_tune_virtual.py); in real time on a loaded 2-core CI machine a contender near
the SLO boundary is measured or not by noise (8 points of 15 there once, 7 here)."""

from __future__ import annotations

import pytest
import yaml
from support import rig

from rig.analysis import metrics as m
from rig.analysis.report import build_report
from rig.results import read_manifest
from rig.sim.profile import load_profile

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STEPS = "0,2,4"
LEVELS = "1,2,4,8,16"
GRID_POINTS = 15
# The question: the most users at a median TPOT of 20 ms. On the hidden server below the answer holds with a margin
# the real-time noise of a loaded 2-core machine cannot take away, whichever way that noise moves the boundary: steps
# 0 meets the SLO at 16 by ~10 %, and if noise pushes it over, it still leads at 8 by ~28 % aggregate tok/s while
# steps 2 misses at 8 and steps 4 at 4-8. (A milder hidden server, 20x draft cost and -0.7 acceptance, left steps 0
# and 2 within 2 % of each other at 8; when a loaded CI machine pushed every configuration over at 16 the grid itself
# flipped to steps 2. An "interactive" question, a tight TPOT at low load, was dropped for the same reason.)
SLO_SETS = {"throughput": ["tpot=20ms", "ttft=2000ms"]}
PERCENTILE = "50"  # medians: a handful of requests per point gives a steady median, not a steady p90
# --deterministic: the server honours per-request seeds, so the grid and tune see the same output lengths.
COMMON = [
    "--steps",
    STEPS,
    "--workload",
    "realistic",
    "--workload-opt",
    "max_tokens=32",
    "--warmup",
    "0",
    "--concurrency",
    LEVELS,
    "--deterministic",
    # deterministic inference turns SGLang's radix cache off, which under its capacity form sizes the state pool for
    # more slots: at steps 4 it takes 22.7 GB of the 19.1 GB that 0.85 leaves, and the sim refuses to launch as SGLang
    # does ("Not enough memory. Please try to increase --mem-fraction-static"); 0.9 leaves room for it
    "--server-arg=--mem-fraction-static",
    "--server-arg=0.9",
    "-q",
]


@pytest.fixture(scope="module")
def hidden_server(tmp_path_factory):
    """A spec file pointing the sim at the hidden profile."""
    d = tmp_path_factory.mktemp("tune")
    # The server's hidden truth: draft forwards 60x slower, acceptance logit 1.0 lower. Tune starts from the
    # reference profile and is never told; the rig only sees what any server shows: its measured requests and its
    # startup limits.
    ref = load_profile()
    hidden = ref.with_values(d_fixed_ms=ref.d_fixed_ms * 60, acc_logit_greedy=ref.acc_logit_greedy - 1.0)
    hidden.save(d / "hidden.yaml")
    spec = d / "spec.yaml"
    spec.write_text(yaml.safe_dump({"server": {"sim_profile": str(d / "hidden.yaml")}}))
    return d, spec


@pytest.mark.parametrize("question", sorted(SLO_SETS))
def test_tune_measures_ordinary_points_and_recommends_what_report_reads_off_them(hidden_server, question):
    d, spec = hidden_server
    flags = [x for t in SLO_SETS[question] for x in ("--slo", t)] + ["--slo-percentile", PERCENTILE]
    tune = rig(
        "tune", "--config", str(spec), *COMMON, *flags, "--out", str(d), "--run-id", f"tune-{question}", timeout=600
    )
    assert tune.returncode == 0, tune.stderr[-3000:]
    run = d / f"tune-{question}"
    man = read_manifest(run)
    section = man["tune"]
    rec = section["recommendation"]
    measured = [p for p in section["probes"] if p.get("meets") is not None]
    # Every probe is an ordinary, complete point of the run, measured once, with what the model predicted for it.
    assert len(measured) == len(man["points"]) == rec["measured_points"] == len({p["point"] for p in measured})
    assert all(p["status"] == "complete" for p in man["points"])
    assert all(p["predicted_margin"] is not None for p in measured)
    assert rec["stable"], rec["stop_reason"]
    assert rec["grid_points"] == GRID_POINTS and rec["measured_points"] < GRID_POINTS
    # The recommendation is what `rig report` reads off the tune run's own points, and its point met the SLOs.
    slos = [m.parse_slo(t) for t in SLO_SETS[question]]
    [tune_best] = build_report(run, slos=slos, slo_percentile=float(PERCENTILE)).best_per_slo
    assert tune_best["steps"] == rec["best_steps"] and tune_best["max_passing"] == rec["max_passing"]
    if rec["max_passing"] is None:  # every passing point flagged invalid (a busy host): no answer, and it says so
        assert "no configuration meets" in rec["answer"], rec["answer"]
        return
    at = [p for p in measured if p["server_config"] == rec["server_config"] and p["level"] == rec["max_passing"]]
    assert [p["meets"] for p in at] == [True], at
    print(f"\n{question}: tune {rec['measured_points']} of {GRID_POINTS} points: {rec['answer']}")
