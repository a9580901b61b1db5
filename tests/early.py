"""Jobs started when the test session starts, at the lowest CPU priority, for tests that would otherwise compute
them in their own time: the campaign refit (`rig sim fit --campaign`: minutes of CPU, nothing to wait on).

The suite mostly waits (Ray starts, servers, real-time levels: about half of 2 cores idle in a CI run), so a job at
nice 19 fills that idle time instead of a test lane's. The controller (pytest's main process) starts each job once
and tells every xdist worker where its output goes (an environment variable); a test calls ``result(name)``, which
waits for the job, or runs it itself when the session did not start it (a single test selected with -k).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

DIR_VAR = "RIG_TEST_EARLY_DIR"
NICE = 19


def refit_argv(out: Path) -> list[str]:
    """The shipped profile's own command (its produced_by), writing to ``out``."""
    from rig.sim.profile import REFERENCE_PROFILE

    cmd = yaml.safe_load(REFERENCE_PROFILE.read_text())["produced_by"].split()
    assert cmd[:4] == ["rig", "sim", "fit", "--campaign"], cmd
    args = cmd[1:]
    args[args.index("-o") + 1] = str(out)
    return [sys.executable, "-m", "rig.cli", *args]


JOBS = {"refit": (refit_argv, "tests/integration/test_sim_fit_campaign.py")}


def _script(argv: list[str], d: Path, name: str) -> list[str]:
    """The job under a shell that records its exit code when it ends (the file the waiters look for)."""
    cmd = f"{shlex.join(argv)} >{shlex.quote(str(d / (name + '.log')))} 2>&1; echo $? >{shlex.quote(str(d / name))}.rc"
    return ["nice", "-n", str(NICE), "sh", "-c", cmd]


def wanted(args: list[str], path: str) -> bool:
    """Whether pytest's arguments select the test file ``path`` (a folder above it or the file; none: all)."""
    paths = [a.split("::", 1)[0] for a in args if not a.startswith("-")]
    if not paths:
        return True
    target = Path(path).resolve()
    return any(target == (p := Path(a).resolve()) or p in target.parents for a in paths)


def start(args: list[str], fast: bool) -> list[subprocess.Popen]:
    """Start the jobs the session's tests need (none for the fast tier); returns their processes."""
    if fast or os.environ.get(DIR_VAR):
        return []
    todo = [name for name, (_, path) in JOBS.items() if wanted(args, path)]
    if not todo:
        return []
    d = Path(tempfile.mkdtemp(prefix="rig-early-"))
    os.environ[DIR_VAR] = str(d)  # before xdist starts its workers: they inherit it
    procs = []
    for name in todo:
        argv = JOBS[name][0](d / f"{name}.out")
        (d / f"{name}.started").write_text(shlex.join(argv))  # before it runs: a waiter never starts it twice
        procs.append(subprocess.Popen(_script(argv, d, name), start_new_session=True))
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    """End jobs still running at the session's end (their tests were deselected or failed early) and remove their
    directory (only the session that started them: ``procs`` is empty elsewhere)."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, 15)
            p.wait(timeout=30)
    if procs and os.environ.get(DIR_VAR):
        shutil.rmtree(os.environ.pop(DIR_VAR), ignore_errors=True)


def result(name: str, tmp: Path, timeout: float = 1200) -> tuple[int, str, Path]:
    """(exit code, log, output path) of a job: the session's, waited for, or run here when there is none."""
    d = os.environ.get(DIR_VAR)
    rc_file = Path(d) / f"{name}.rc" if d else None
    if rc_file is None or not (rc_file.parent / f"{name}.started").exists():
        out = tmp / f"{name}.out"
        p = subprocess.run(JOBS[name][0](out), capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout + p.stderr, out
    deadline = time.monotonic() + timeout
    while not rc_file.exists() or not rc_file.read_text().strip():
        if time.monotonic() > deadline:
            raise TimeoutError(f"early job {name} did not end within {timeout:g}s")
        time.sleep(0.5)
    return int(rc_file.read_text()), (rc_file.parent / f"{name}.log").read_text(), rc_file.parent / f"{name}.out"
