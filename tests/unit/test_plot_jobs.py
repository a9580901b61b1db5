"""Plot jobs: drawn in forked workers only from a single-threaded process, and never hung by a worker that dies."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from rig.analysis import plots

PARENT = os.getpid()


def _dies_in_a_worker(report: object, path: Path) -> Path:
    if os.getpid() != PARENT:
        os._exit(3)  # what a worker segfaulting inside matplotlib looks like to the pool
    return path


def test_a_dead_worker_falls_back_to_drawing_here(monkeypatch, tmp_path):
    monkeypatch.setattr(plots.threading, "active_count", lambda: 1)
    monkeypatch.setattr(plots.os, "cpu_count", lambda: 2)
    jobs = [(_dies_in_a_worker, (tmp_path / f"{i}.png",)) for i in range(3)]
    assert plots.render_jobs(object(), jobs) == [tmp_path / f"{i}.png" for i in range(3)]  # type: ignore[arg-type]


def test_no_fork_while_other_threads_run(monkeypatch, tmp_path):
    forked: list[int] = []
    monkeypatch.setattr(plots.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(plots, "ProcessPoolExecutor", lambda *a, **k: forked.append(1))
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        jobs = [(lambda r, p: p, (tmp_path / f"{i}.png",)) for i in range(2)]
        assert plots.render_jobs(object(), jobs) == [tmp_path / "0.png", tmp_path / "1.png"]  # type: ignore[arg-type]
    finally:
        stop.set()
        t.join()
    assert forked == []
