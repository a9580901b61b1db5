"""What a new user meets in the first hour (issue 12): every fault ends with one line and the right exit code, no
run directory is overwritten or merged, a resume works on exactly the directory given, and nothing taken is lost."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rig.config import build_spec
from rig.results import read_manifest, read_requests

from accounting import assert_accounting

ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
SMALL = ["--concurrency", "2", "--requests", "4", "--workload", "greedy", "--workload-opt", "max_tokens=8",
         "--warmup", "0", "-q"]


def rig(*args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rig.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env={**ENV, **(env or {})})


def one_line_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """The process exited with ``code`` and printed exactly one 'rig: error:' line, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("rig: error: "), proc.stderr[-3000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def fake_run(root: Path, run_id: str = "old") -> Path:
    """A run directory as an earlier run left it (a manifest and one part file)."""
    run = root / run_id
    part = run / "requests" / "point=p" / "gen=0" / "part-00000.parquet"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"not really parquet")
    (run / "manifest.json").write_text(json.dumps({"run_id": run_id, "status": "complete", "points": []}))
    return run


# ------------------------------------------------------------------------------------------ run directory: no Ray
def test_a_reused_run_id_is_refused_and_the_earlier_run_is_untouched(tmp_path):
    run = fake_run(tmp_path)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    proc = rig("run", *SMALL, "--out", str(tmp_path), "--run-id", "old")
    one_line_error(proc, 2, "already exists", "--resume")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_a_run_dir_is_locked_while_a_run_holds_it(tmp_path):
    from rig.runner import Runner, RunInputError

    spec = build_spec({}, {"out": str(tmp_path), "run_id": "x"})
    first = Runner(spec)
    first._claim_run_dir()
    try:
        second = Runner(spec, resume=True)  # even a resume of a directory in use is refused
        with pytest.raises(RunInputError, match="in use by another rig process"):
            second._claim_run_dir()
        with pytest.raises(RunInputError):  # and so is a new run into it, once it has contents
            (tmp_path / "x" / "manifest.json").write_text("{}")
            Runner(spec)._claim_run_dir()
    finally:
        first._release_lock()
    Runner(spec, resume=True)._claim_run_dir()  # free again once the first run ends


@pytest.mark.parametrize("content", ['{"run_id": "x", "status": "runn', "", "[]", '{"run_id": "x"}'])
def test_resume_of_a_damaged_manifest_is_one_line(tmp_path, content):
    run = tmp_path / "x"
    run.mkdir()
    (run / "manifest.json").write_text(content)
    one_line_error(rig("sweep", "--resume", str(run)), 2, "cannot resume", str(run))


def test_resume_refuses_flags_it_would_ignore(tmp_path):
    run = fake_run(tmp_path)
    one_line_error(rig("sweep", "--resume", str(run), "--concurrency", "4"), 2, "--concurrency")


# ------------------------------------------------------------------------------------------ resume in place: Ray
@pytest.mark.ray
def test_copied_and_moved_runs_resume_in_place_and_missing_records_are_rerun(tmp_path):
    proc = rig("sweep", "--steps", "0,1", *SMALL, "--out", str(tmp_path), "--run-id", "orig")
    assert proc.returncode == 0, proc.stderr[-3000:]
    orig = tmp_path / "orig"
    orig_manifest = (orig / "manifest.json").read_bytes()

    # A copy with one part file deleted: the resume re-runs that point in the copy, and only there.
    copy = tmp_path / "copy"
    shutil.copytree(orig, copy)
    victim = sorted((copy / "requests").rglob("part-*.parquet"))[0]
    point = victim.parent.parent.name.split("=", 1)[1]
    victim.unlink()
    proc = rig("sweep", "--resume", str(copy))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (orig / "manifest.json").read_bytes() == orig_manifest
    assert not (orig / "superseded").exists()
    m = read_manifest(copy)
    assert m["status"] == "complete" and len(m["resumed"]) == 1
    assert_accounting(copy)
    assert len(read_requests(copy)) == 8
    assert (copy / "superseded").exists()  # the point's remaining rows were moved aside, not merged
    assert {p["point"] for p in m["points"]} >= {point}

    # A moved run that is complete: nothing to do, nothing rewritten, nothing created at the old path.
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    shutil.move(str(orig), moved)
    proc = rig("sweep", "--resume", str(moved))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "nothing to resume" in proc.stderr
    assert (moved / "manifest.json").read_bytes() == orig_manifest
    assert not orig.exists()


# ------------------------------------------------------------------------------------------ one reader, honest compare
def _two_part_run(d: Path) -> Path:
    """Baseline and candidate, identical; the candidate's 40 requests in two part files of 20."""
    import numpy as np
    from test_compare import _point, _write_point
    from rig.analysis.synthetic import write_run

    write_run(d, {"run_id": d.name, "status": "complete", "points": [
        {**_point("base", 0), "requests_scheduled": 40, "records": {"ok": 40, "failed": 0, "cancelled": 0}},
        {**_point("cand", 2), "requests_scheduled": 40, "records": {"ok": 40, "failed": 0, "cancelled": 0},
         "generators": [{"generator": 0, "status": "complete", "parts": ["part-00000.parquet"]}]}]})
    _write_point(d, "base", 0, np.ones(40))
    _write_point(d, "cand", 2, np.ones(40))
    return d


def test_compare_says_incomplete_next_to_every_figure_whose_parts_are_unreadable(tmp_path):
    from click.testing import CliRunner

    from rig.analysis.cli import compare as compare_cmd, report as report_cmd
    from rig.analysis.compare import compare

    a = _two_part_run(tmp_path / "a")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    part = next((b / "requests" / "point=cand").rglob("part-*.parquet"))
    os.truncate(part, part.stat().st_size // 2)
    res = compare(str(a), str(b))
    by_point = {(r["candidate_point"], r["metric"]): r for r in res["speedups"]}
    assert all(by_point[("cand", m)]["incomplete"] and "unreadable_parts" in by_point[("cand", m)]["incomplete"]
               for m in ("e2e", "ttft"))
    assert not by_point[("base", "e2e")]["incomplete"]  # the intact pair is not marked
    assert all(r["incomplete"] for r in res["best"])  # each level's ranking involves the cut point
    assert any("unreadable part file" in w for w in res["warnings"])
    out = CliRunner().invoke(compare_cmd, [str(a), str(b)])
    assert out.exit_code == 0, out.output
    assert "! incomplete" in out.output and "unreadable part file" in out.output
    # report reads through the same reader: it warns and flags the same point
    rep = CliRunner().invoke(report_cmd, [str(b), "--json"])
    rows = {r["point"]: r for r in json.loads(rep.stdout[rep.stdout.index("["):])}
    assert "unreadable_parts" in rows["cand"]["flags"] and "unreadable_parts" not in rows["base"]["flags"]


def test_a_part_file_listed_in_the_manifest_but_gone_is_flagged(tmp_path):
    from rig.analysis.runs import load_run
    from rig.analysis.tables import campaign_table

    b = _two_part_run(tmp_path / "b")
    next((b / "requests" / "point=cand").rglob("part-*.parquet")).unlink()
    run = load_run(b)
    assert any("missing" in w for w in run.warnings)
    rows = {r["point"]: r for r in campaign_table(run)}
    assert {"missing_parts", "no_rows"} <= set(rows["cand"]["flags"])


def test_report_and_compare_on_no_run_exit_2_and_baseline_steps_names_the_steps(tmp_path):
    one_line_error(rig("report", str(tmp_path / "nope")), 2, "nope")
    one_line_error(rig("compare", str(tmp_path / "nope"), "--baseline-steps", "0"), 2, "nope")
    a = _two_part_run(tmp_path / "a")
    one_line_error(rig("compare", str(a), "--baseline-steps", "7"), 2, "steps=7", "0, 2")
