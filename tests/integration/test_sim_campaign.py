"""The campaign's benchmark through the real rig path (`rig sweep` on the sim, greedy, Ray, HTTP streaming, Parquet,
`rig report`), asserting what a busy host cannot change: every request served and recorded, the speculative
acceptance the model draws, the simulated telemetry labelled as such.

The campaign's *figures* (throughput, per-request decode, the C=64 regression, the steps 3/4 crossover) are held to
the campaign on the simulator's virtual clock, where host load cannot reach them: tests/unit/test_sim_model.py
and tests/unit/test_sim_campaign_schedule.py. Through the real path they depend on this 2-core host's load (CI
once measured 184.9 tok/s at steps 4, C=16, against 163.4 +- 10 %), so they are not asserted here; the real path's
timing truth is measured by benchmarks (docs/benchmarks.md), which print and never fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rig.contracts import DISTURBED_FLAGS
from rig.sim.profile import load_profile
from rig.sim.virtual import Scenario, run_closed_loop, summarize

TIME_SCALE = 0.25  # the sim's clock 4x as fast (--sim-fault slow=0.25): the levels take a quarter of the time
LEVELS = "1,4"
REQUESTS = {1: 4, 4: 8}  # rig's default: 4 at C=1, 2 x C above


def _rig(*args: str) -> str:
    p = subprocess.run([sys.executable, "-m", "rig.cli", *args], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return p.stdout


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[Path, list[dict]]:
    tmp = tmp_path_factory.mktemp("campaign")
    server = ["--server-arg=--sim-fault", f"--server-arg=slow={TIME_SCALE}"]
    _rig("sweep", "--workload", "greedy", "--steps", "3,4", "--concurrency", LEVELS, *server, "--out", str(tmp),
         "--run-id", "c", "-q")  # fmt: skip
    return tmp / "c", json.loads(_rig("report", str(tmp / "c"), "--json"))


@pytest.mark.slow
def test_every_request_is_served_and_recorded(sweep):
    run, rows = sweep
    assert sorted((r["steps"], r["concurrency"]) for r in rows) == [(3, 1), (3, 4), (4, 1), (4, 4)]
    for r in rows:
        assert (r["requests"], r["ok"], r["failed"], r["cancelled"]) == (REQUESTS[r["concurrency"]],) * 2 + (0, 0)
        assert r["tokens"] == sum(_greedy_lengths(r["requests"]))
        # a point the host disturbed says so (its figures are not trusted); nothing else may be flagged
        assert set(r["flags"]) <= DISTURBED_FLAGS, r.get("flag_reasons")
    manifest = json.loads((run / "manifest.json").read_text())
    assert all(p["status"] == "complete" for p in manifest["points"])


@pytest.mark.slow
def test_acceptance_is_the_models_whatever_the_host_load(sweep):
    """Accepted drafts per verify come from the model's draws, not the clock: the same as in virtual time for the
    same requests (within the spread of a few 1,000-token requests' draws)."""
    _, rows = sweep
    prof = load_profile()
    for r in rows:
        n = r["requests"]
        virtual = summarize(run_closed_loop(prof, Scenario(r["steps"], r["concurrency"], n, _greedy_lengths(n),
                                                           _greedy_prompts())))  # fmt: skip
        assert r["accept_length"] == pytest.approx(virtual["accept_length"], rel=0.08), r["point"]


@pytest.mark.slow
def test_simulated_telemetry_is_labelled(sweep):
    run, rows = sweep
    for r in rows:
        assert r["energy_source"] == "simulated" and r["energy_method"] == "counter" and r["gpus"] == 4
    report = json.loads(_rig("report", str(run), "--json-full"))
    assert any("SIMULATED" in line for line in report["telemetry"])


def _greedy_workload():
    from rig.workloads import build_sessions
    from rig.workloads.spec import WorkloadSpec

    return build_sessions, WorkloadSpec(name="greedy")


def _greedy_lengths(n: int) -> tuple[int, ...]:
    build, spec = _greedy_workload()
    return tuple(s.turns[0].max_tokens for s in build(spec, seed=0, n_sessions=n))


def _greedy_prompts() -> tuple[str, ...]:
    build, spec = _greedy_workload()
    return tuple(s.turns[0].messages[-1]["content"] for s in build(spec, seed=0, n_sessions=6))
