"""A load profile on the embedded default: `rig run --load-profile` through Ray against the simulated server, two
generators, then `rig report` (bookkeeping and phases, not speed)."""

import json

import pytest
from accounting import assert_accounting
from support import rig

from rig.results import read_manifest, read_requests

pytestmark = pytest.mark.ray

ARGS = ["--load-profile", "1:4s,8:4s,1:4s", "--steps", "2", "--clients", "2", "--workload-opt", "max_tokens=16"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    proc = rig("run", *ARGS, "--out", str(out), "--run-id", "profile")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Load profile ·" in proc.stdout and "steady state per phase" in proc.stdout  # the run ends with it
    return out / "profile"


def test_every_record_knows_its_phase_and_each_generator_kept_its_share(run):
    m = read_manifest(run)
    (p,) = m["points"]
    assert m["status"] == "complete" and p["status"] == "complete" and "-profile-c8" in p["point"]
    assert [(ph["concurrency"], ph["start_s"], ph["duration_s"]) for ph in p["phases"]] == [
        (1, 0.0, 4.0),
        (8, 4.0, 4.0),
        (1, 8.0, 4.0),
    ]
    t = read_requests(run).to_pandas()
    assert t.ok.all() and set(t.phase) == {0, 1, 2} and t.request_id.is_unique  # a lowered cap cancels nothing
    assert_accounting(run)
    # concurrency 1 over two generators is generator 0's alone; 8 is four each
    assert set(t[t.phase != 1].generator) == {0} and set(t[t.phase == 1].generator) == {0, 1}
    start = p["start_wall"]
    for phase, rows in t.groupby("phase"):
        due = rows.intended_send_ts - rows.clock_offset_s - start
        assert (due >= 4.0 * phase - 0.05).all() and (due < 4.0 * (phase + 1) + 0.05).all(), phase


def test_the_report_shows_the_timeline_with_every_phase(run, tmp_path):
    proc = rig("report", str(run), "--json-full", "--timeline-window", "2")
    assert proc.returncode == 0, proc.stderr
    (tl,) = json.loads(proc.stdout)["timeline"]
    assert [ph["label"] for ph in tl["phases"]] == ["1:4s", "8:4s", "1:4s"]
    assert sum(w["sends"] for w in tl["windows"]) == len(read_requests(run))
    assert all(w["spec_steps"] == 2.0 for w in tl["windows"] if w["spec_steps"] is not None)  # fixed steps
    shown = rig("report", str(run), "--plots", str(tmp_path / "plots"))
    assert shown.returncode == 0 and "Load profile" in shown.stdout and "Timeline" in shown.stdout
    assert list((tmp_path / "plots").glob("timeline_*.svg"))
