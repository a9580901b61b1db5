"""Faults on the sim, through `rig run` / `rig sweep` exactly as against SGLang (the sim misbehaves on purpose with
--sim-fault, passed verbatim as --server-arg or server.extra_args). Each request that a fault hits gives exactly one
failed record with its status and message, the rest of the run goes on, and nothing is lost (accounting invariant).

What the test double (tests/integration/test_faults.py) already proves is not repeated: a killed generator, SIGTERM, an
unwritable output. The sim adds per-request faults the double cannot make (HTTP errors, broken streams, wrong
content type, a hang after the headers), a crash mid-point with requests in flight on a real serving engine, a sweep
whose next server configuration is healthy, and a slowed-down server against the total request timeout.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import rig

from rig.sim.faults import FaultPlan, parse_fault

BASE = ["--engine", "sim", "--workload", "greedy", "--steps", "1", "--warmup", "0", "-q"]


def fault_args(*specs: str) -> list[str]:
    out: list[str] = []
    for s in specs:
        out += ["--server-arg=--sim-fault", f"--server-arg={s}"]
    return out


# ---------------------------------------------------------------- flags (no Ray)
@pytest.mark.parametrize(
    "spec, message",
    [
        ("http=700", "http must be <= 599, got 700"),
        (
            "bogus",
            "unknown fault 'bogus' (known: crash_after, crash_at, slow, stall, http, hang, hang_headers, truncate, "
            "reset, malformed, content_type)",
        ),
        ("hang,after=2", "hang does not take after"),
        ("truncate,every=0", "every must be >= 1, got 0"),
        ("http=503,every=2,fraction=0.5", "http: give every= or fraction=, not both"),
        ("slow=0", "slow must be > 0, got 0"),
        ("stall=0", "stall must be > 0, got 0"),
        ("stall=1,at=-1", "at must be >= 0, got -1"),
        ("http=503,at=1", "http does not take at"),
        ("malformed=xml", "malformed must be 'text' (not JSON) or 'meta' (no meta_info), got 'xml'"),
    ],
)
def test_a_bad_fault_spec_is_one_line_and_exit_2(spec, message):
    res = subprocess.run(
        [sys.executable, "-m", "rig.sim", "--model-path", "m", "--sim-fault", spec],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [f"rig.sim: error: argument --sim-fault: {message}"]


def test_the_rig_refuses_a_bad_sim_flag_before_anything_starts(tmp_path):
    # No Ray and so no server: a Ray start would make its session directory under RAY_TMPDIR (a time bound here
    # failed at load 25: 19 s for the refusal alone).
    ray_tmp = tmp_path / "ray-tmp"
    res = rig(
        "run", *BASE, *fault_args("http=503,evry=2"), "--out", str(tmp_path), "--run-id", "x", timeout=60,
        env={"RAY_TMPDIR": str(ray_tmp)},
    )  # fmt: skip
    assert res.returncode == 2 and not ray_tmp.exists()
    assert res.stderr.strip().splitlines() == [
        "rig: error: server: the simulated server would refuse its flags: argument --sim-fault: http: unknown option "
        "'evry=2' (options: key=value with key in after, at, code, every, fraction, offset, seed) "
        "(steps=1, extra_args=['--sim-fault', 'http=503,evry=2'])"
    ]
    assert not (tmp_path / "x").exists()


def test_selection_is_by_arrival_number_or_by_rid():
    plan = FaultPlan(
        [parse_fault("http=503,every=3,offset=1"), parse_fault("truncate,fraction=0.5,seed=9"), parse_fault("hang")]
    )
    assert [i for i in range(1, 12) if plan.choose(i, "x").kind == "http"] == [1, 4, 7, 10]
    # fraction: a property of the rid alone (any arrival number), the same set at every run
    rids = [f"greedy-{i:06d}-t0" for i in range(400)]
    picked = {r for r in rids if plan.choose(2, r).kind == "truncate"}
    assert picked == {r for r in rids if plan.choose(3, r).kind == "truncate"}
    assert 160 < len(picked) < 240  # about half
    assert {plan.choose(2, r).kind for r in rids} == {"truncate", "hang"}  # the rest fall through to 'hang'
