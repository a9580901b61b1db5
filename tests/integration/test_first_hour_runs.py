"""The first hour, end to end on the simulator: runs a user starts, interrupts, resumes and repeats (integration tier;
the fast checks are in test_first_hour.py)."""

import json
import shutil
import signal
import time
from pathlib import Path

import pytest
from accounting import assert_accounting
from support import rig, start_rig

from rig.results import read_manifest, read_requests

SMALL = [
    "--concurrency",
    "2",
    "--requests",
    "4",
    "--workload",
    "greedy",
    "--workload-opt",
    "max_tokens=8",
    "--warmup",
    "0",
    "-q",
]


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


@pytest.mark.ray
def test_a_run_whose_requests_all_fail_names_why_on_screen_and_in_the_report(tmp_path):
    proc = rig(
        "run",
        *SMALL,
        "--steps",
        "0",
        "--server-arg=--sim-fault",
        "--server-arg=http=500",
        "--out",
        str(tmp_path),
        "--run-id",
        "f",
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "What went wrong" in proc.stdout and "4 x failed: HTTP 500" in proc.stdout, proc.stdout[-3000:]
    assert "client_saturated" not in proc.stdout
    rep = rig("report", str(tmp_path / "f"))
    assert rep.returncode == 0 and "4 x failed: HTTP 500" in rep.stdout, rep.stdout[-3000:]
    assert_accounting(tmp_path / "f")


# ------------------------------------------------------------------------------------------ stopping
def _wait_running(run: Path, timeout: float = 120, parts: bool = True) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if any(p["status"] == "running" for p in read_manifest(run)["points"]) and (
                not parts or any((run / "requests").rglob("part-*.parquet"))
            ):
                return
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError("the point never ran")


@pytest.mark.ray
def test_double_ctrl_c_ends_interrupted_with_every_record_accounted(tmp_path):
    proc = start_rig(
        "run",
        "--concurrency",
        "4",
        "--duration",
        "60",
        "--workload",
        "greedy",
        "--workload-opt",
        "max_tokens=64",
        "--warmup",
        "0",
        "-q",
        "--out",
        str(tmp_path),
        "--run-id",
        "cc",
    )
    run = tmp_path / "cc"
    _wait_running(run)
    # An impatient user: Ctrl-C again and again while the run stops, so some land in its final bookkeeping.
    for _ in range(40):
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGINT)
        time.sleep(0.1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in out + err
    m = read_manifest(run)
    assert m["status"] == "interrupted" and m["points"][0]["status"] == "interrupted"
    assert_accounting(run)


@pytest.mark.ray
def test_sigterm_on_an_overloaded_run_stops_and_counts_what_is_on_disk(tmp_path):
    # 100,000 closed-loop slots swamp one generator on a small machine: it cannot honour a stop in time
    proc = start_rig(
        "run",
        "--concurrency",
        "100000",
        "--duration",
        "30",
        "--steps",
        "0",
        "--workload",
        "greedy",
        "--workload-opt",
        "max_tokens=8",
        "--warmup",
        "0",
        "-q",
        "--out",
        str(tmp_path),
        "--run-id",
        "ov",
    )
    run = tmp_path / "ov"
    _wait_running(run, timeout=180, parts=False)  # overloaded, it may write its first part only when stopped
    time.sleep(8.0)  # into the level, with the generator swamped
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in out + err and "internal error" not in out + err
    m = read_manifest(run)
    # The stop is bounded (generators get 4 s, then are killed); how fast is the host's business, not the test's:
    # 10.9 s once beside a CPU-bound build on this 2-core machine. Only a stop that hangs fails here.
    assert took < 60.0, (took, m["points"][0].get("generators"))
    assert m["status"] == "interrupted" and m["points"][0]["status"] == "interrupted"
    assert_accounting(run)  # the manifest counts exactly the rows on disk


# ------------------------------------------------------------------------------------------ one seed, one corpus
def _code_tree(root: Path, salt: str = "") -> Path:
    root.mkdir(parents=True)
    for i in range(3):
        (root / f"m{i}.py").write_text("".join(f"def f{i}_{k}(x):\n    return x + {k}  # {salt}\n" for k in range(80)))
    return root


@pytest.fixture(scope="module")
def code_run(tmp_path_factory) -> tuple[Path, Path]:
    """One embedded-default run of the realistic workload pinned to a code tree (its run dir, the tree): the corpus
    test and the loopback test read the same run."""
    tmp = tmp_path_factory.mktemp("code")
    tree = _code_tree(tmp / "tree")
    proc = rig(
        "run",
        "--concurrency",
        "2",
        "--requests",
        "4",
        "--workload",
        "realistic",
        "--workload-opt",
        "max_tokens=8",
        "--workload-opt",
        f"code_dir={tree}",
        "--warmup",
        "0",
        "-q",
        "--steps",
        "0",
        "--out",
        str(tmp),
        "--run-id",
        "cp",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "cp", tree


@pytest.mark.ray
def test_the_embedded_default_listens_on_loopback_and_a_busy_port_is_an_error(code_run, tmp_path):
    import socket

    m = read_manifest(code_run[0])
    (cfg,) = m["server_configs"].values()
    assert cfg["url"].startswith("http://127.0.0.1:")
    assert cfg["command"][cfg["command"].index("--host") + 1] == "127.0.0.1"
    assert {g["node_ip"] for g in m["cluster"]["generators"]} == {"127.0.0.1"}
    with socket.socket() as s:  # the port the user asks for is taken: say so, do not start elsewhere
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = rig("run", *SMALL, "--steps", "0", "--port", str(port), "--out", str(tmp_path), "--run-id", "busy")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    m = read_manifest(tmp_path / "busy")
    assert f"port {port}" in m["points"][0]["error"] and "in use" in m["points"][0]["error"]
    assert f"port {port}" in proc.stdout  # the run's end names it


@pytest.mark.ray
def test_the_manifest_records_each_hosts_corpus_and_code_dir_pins_it(code_run):
    run, tree = code_run
    corpus = read_manifest(run)["cluster"]["corpus"]
    host = read_manifest(run)["cluster"]["generators"][0]["host"]
    assert set(corpus) == {"driver", "generator 0 (" + host + ")"}
    assert {c["realistic"]["root"] for c in corpus.values()} == {str(tree)}
    assert len({c["realistic"]["sha256"] for c in corpus.values()}) == 1
    assert_accounting(run)


@pytest.mark.ray
def test_a_launched_engine_that_exits_fails_at_once_not_after_its_load_budget(tmp_path):
    t0 = time.monotonic()
    proc = rig(
        "run",
        *SMALL,
        "--engine",
        "sglang",
        "--engine-python",
        "/bin/false",
        "--model",
        "m",
        "--tp",
        "1",
        "--out",
        str(tmp_path),
        "--run-id",
        "x",
        timeout=120,
    )
    took = time.monotonic() - t0
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert took < 60, took  # Ray start plus a moment: the 30-minute model-load budget is not waited out
    m = read_manifest(tmp_path / "x")
    assert "exited with code 1 before it was healthy" in m["points"][0]["error"]
    assert "exited with code 1 before it was healthy" in proc.stdout


@pytest.mark.ray
def test_two_runs_started_at_once_with_one_id_one_runs_the_other_is_refused(tmp_path):
    args = ("run", *SMALL, "--steps", "0", "--out", str(tmp_path), "--run-id", "same")
    procs = [start_rig(*args) for _ in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], [o[1][-1500:] for o in outs]
    refused = next(o for p, o in zip(procs, outs, strict=True) if p.returncode == 2)
    assert "Traceback" not in refused[1] and len(refused[1].strip().splitlines()) == 1
    assert "already exists" in refused[1] or "in use by another rig process" in refused[1]
    m = read_manifest(tmp_path / "same")
    assert m["status"] == "complete" and len(m["points"]) == 1
    assert_accounting(tmp_path / "same")
