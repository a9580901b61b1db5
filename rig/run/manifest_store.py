"""The run's manifest.json: the one class that creates, resumes, changes and saves it."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

import ray

import rig
from rig.config import RunSpec
from rig.results import read_manifest, write_manifest
from rig.run.parts_on_disk import count_rows_on_disk, rows_by_status
from rig.run.points import Point


def versions() -> dict[str, str]:
    import aiohttp
    import pyarrow

    return {"rig": rig.__version__, "python": platform.python_version(), "ray": ray.__version__,
            "aiohttp": aiohttp.__version__, "pyarrow": pyarrow.__version__, "platform": platform.platform()}


def point_entry(p: Point, load_mode: str) -> dict[str, Any]:
    """A pending point's manifest entry."""
    return {"point": p.point, "server_config": p.config_id, "engine": p.server.engine,
            "workload": p.workload.name, "steps": p.server.steps, "load_mode": load_mode,
            "concurrency": p.concurrency, "rate": p.rate, "repeat": p.repeat, "status": "pending",
            "started_ts": None, "ended_ts": None, "requests_scheduled": 0,
            "records": {"ok": 0, "failed": 0, "cancelled": 0}, "window_acceptance": None,
            "flush_cache": None, "flags": [], "generators": []}


class ManifestStore:
    """Holds the manifest of one run directory; every change to it goes through a method here, then save()."""

    def __init__(self, run_dir: Path, load_mode: str):
        self.run_dir = run_dir
        self.load_mode = load_mode
        self.data: dict[str, Any] = {}

    def save(self) -> None:
        write_manifest(self.run_dir, self.data)

    # ---------------------------------------------------------------- a run's start
    def create(self, spec: RunSpec, points: list[Point]) -> None:
        self.data = {
            "run_id": spec.run_id,
            "status": "running",
            "created": time.time(),
            "spec": json.loads(spec.model_dump_json()),
            "versions": versions(),
            "cluster": {},
            "server_configs": {},
            "points": [point_entry(p, self.load_mode) for p in points],
        }

    def resume(self, points: list[Point]) -> None:
        self.data = read_manifest(self.run_dir)
        self._recheck_complete_points()
        self.data.pop("error", None)  # the earlier attempt's; this one records its own
        self.data["status"] = "running"
        self.data.setdefault("resumed", []).append(time.time())
        known = {p["point"] for p in self.data["points"]}
        for p in points:
            if p.point not in known:
                self.data["points"].append(point_entry(p, self.load_mode))

    def _recheck_complete_points(self) -> None:
        """A point marked complete whose records are no longer all on disk (a part file deleted or cut short) is
        run again: its remaining rows are moved aside by rundir.supersede before it runs."""
        for entry in self.data.get("points") or []:
            if entry.get("status") != "complete":
                continue
            want = sum((entry.get("records") or {}).values())
            have = count_rows_on_disk(self.run_dir, entry["point"])
            if have != want:
                entry.update(status="pending", error=f"re-run on resume: {have} of {want} records found on disk")

    def finished_on_disk(self, points: list[Point]) -> bool:
        """A resume with nothing left: the run completed and every point's records are on disk."""
        try:
            m = read_manifest(self.run_dir)
        except (FileNotFoundError, ValueError):
            return False
        entries = {p["point"]: p for p in m.get("points") or []}
        if m.get("status") != "complete" or any(p.point not in entries for p in points):
            return False
        self.data = m
        return all(e["status"] == "complete" and count_rows_on_disk(self.run_dir, e["point"])
                   == sum((e.get("records") or {}).values()) for e in entries.values())

    # ---------------------------------------------------------------- points
    def entry(self, pid: str) -> dict[str, Any]:
        return next(p for p in self.data["points"] if p["point"] == pid)

    def has_point(self, pid: str) -> bool:
        return any(e["point"] == pid for e in self.data["points"])

    def add_point(self, p: Point) -> None:
        self.data["points"].append(point_entry(p, self.load_mode))

    def update_point(self, pid: str, **fields: Any) -> None:
        self.entry(pid).update(fields)

    def point_statuses(self) -> list[str]:
        return [p["status"] for p in self.data["points"]]

    # ---------------------------------------------------------------- cluster and servers
    def set_cluster(self, section: dict[str, Any]) -> None:
        self.data["cluster"] = section

    def server_config(self, config_id: str) -> dict[str, Any]:
        return self.data["server_configs"][config_id]

    def set_server_config(self, config_id: str, entry: dict[str, Any]) -> None:
        self.data["server_configs"][config_id] = entry

    def update_server_config(self, config_id: str, **fields: Any) -> None:
        self.data["server_configs"][config_id].update(fields)

    # ---------------------------------------------------------------- a run's end
    def set_error(self, message: str) -> None:
        self.data["error"] = message

    def close_running_points(self) -> None:
        """Points cut off before their generators reported: count what reached the disk (the generators are dead
        now, so nothing is written after this count)."""
        for p in self.data["points"]:
            if p["status"] == "running":
                records = rows_by_status(self.run_dir, p["point"])
                p.update(status="interrupted", records=records, requests_scheduled=sum(records.values()),
                         ended_ts=p.get("ended_ts") or time.time())

    def finish(self, status: str, stop_reason: str | None) -> None:
        self.data["status"] = status
        self.data["stop_reason"] = stop_reason
        self.data["finished"] = time.time()
