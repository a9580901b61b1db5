"""rig sweep --search bisects, records its points and resumes (integration tier: a real sweep on the simulator; the
search's fast checks are in test_tune_search.py)."""

from __future__ import annotations

import json
import shutil

import pytest
from support import rig

from rig.results import read_manifest


@pytest.mark.ray
@pytest.mark.slow
def test_sweep_search_bisects_records_points_and_resumes(tmp_path):
    """Every probe is an ordinary point (report reads it); a resumed search re-runs only the missing probe and ends
    with the same answer."""
    args = [
        "sweep",
        "--steps",
        "2",
        "--workload",
        "realistic",
        "--workload-opt",
        "max_tokens=24",
        "--warmup",
        "0",
        "--search",
        "concurrency",
        "--slo",
        "tpot=22ms",
        "--slo-percentile",
        "90",
        "--search-max",
        "16",
        "--out",
        str(tmp_path),
        "--run-id",
        "srch",
        "-q",
    ]
    proc = rig(*args, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "srch"
    man = read_manifest(run)
    [res] = man["search"]["results"]
    probes = res["probe_points"]
    assert res["probes"] == len(probes) == len(man["points"]) >= 2
    assert {p["point"] for p in probes} == {p["point"] for p in man["points"]}
    assert all(p["status"] == "complete" for p in man["points"])
    # The answer is consistent with its probes: everything at or below max passing passed, above min failing failed.
    passing = [p["value"] for p in probes if p["meets"]]
    failing = [p["value"] for p in probes if not p["meets"]]
    mp = res["max_passing"]["level"] if res["max_passing"] else None
    mf = res["min_failing"]["level"] if res["min_failing"] else None
    assert mp == (max(passing) if passing else None) and mf == (min(failing) if failing else None)
    if res["status"] == "bracketed":
        assert mf == mp + 1
        assert res["max_passing"]["margin"] >= 0 > res["min_failing"]["margin"]
    rep = rig("report", str(run), "--json")
    assert rep.returncode == 0, rep.stderr
    assert {r["point"] for r in json.loads(rep.stdout)} == {p["point"] for p in probes}
    # Interrupt after the fact: the last probe never ran. Resume re-runs that probe only and reaches the same answer.
    last = probes[-1]["point"]
    for e in man["points"]:
        if e["point"] == last:
            e["status"] = "interrupted"
    man["status"] = "interrupted"
    (run / "manifest.json").write_text(json.dumps(man))
    shutil.rmtree(run / "requests" / f"point={last}")
    proc = rig("sweep", "--resume", str(run), "-q")
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = read_manifest(run)
    [res2] = again["search"]["results"]
    # The same probes in the same order (the re-measured last one may land on the other side of the SLO by noise and
    # extend the search, never change what came before it).
    assert [p["point"] for p in res2["probe_points"]][: len(probes)] == [p["point"] for p in probes]
    assert [p["meets"] for p in res2["probe_points"]][: len(probes) - 1] == [p["meets"] for p in probes][:-1]
    assert again["status"] == "complete"
    assert (run / "requests" / f"point={last}").exists()
    assert len(again.get("resumed", [])) == 1
