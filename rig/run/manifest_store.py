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
from rig.contracts import (
    ClusterInfo,
    ContractError,
    Manifest,
    PointEntry,
    RecordCounts,
    ServerConfigEntry,
    thresholds_of_spec,
)
from rig.contracts.profile import LoadPhase, schedule
from rig.results import load_manifest, write_manifest
from rig.run.parts_on_disk import count_rows_on_disk, rows_by_status
from rig.run.points import Point


def versions() -> dict[str, str]:
    import aiohttp
    import pyarrow

    return {
        "rig": rig.__version__,
        "python": platform.python_version(),
        "ray": ray.__version__,
        "aiohttp": aiohttp.__version__,
        "pyarrow": pyarrow.__version__,
        "platform": platform.platform(),
    }


def point_entry(p: Point, load_mode: str, profile: list[LoadPhase] | None = None) -> PointEntry:
    """A pending point's manifest entry (with a load profile: its phases, each with its start)."""
    entry = PointEntry.new(p.identity(load_mode))
    if profile:
        entry.phases = schedule(profile)
    return entry


class ManifestStore:
    """Holds the manifest of one run directory; every change to it goes through a method here, then save()."""

    def __init__(self, run_dir: Path, load_mode: str, profile: list[LoadPhase] | None = None):
        self.run_dir = run_dir
        self.load_mode = load_mode
        self.profile = profile
        self.data = Manifest()

    def save(self) -> None:
        write_manifest(self.run_dir, self.data)

    # ---------------------------------------------------------------- a run's start
    def create(self, spec: RunSpec, points: list[Point]) -> None:
        spec_json = json.loads(spec.model_dump_json())
        self.data = Manifest(
            run_id=spec.run_id,
            status="running",
            created=time.time(),
            spec=spec_json,
            versions=versions(),
            thresholds=thresholds_of_spec(spec_json),  # what judge_point holds every point to
            points=[point_entry(p, self.load_mode, self.profile) for p in points],
        )

    def resume(self, points: list[Point], redo: frozenset[str] = frozenset()) -> None:
        """Continue the run in place: points not complete run (again); so do complete ones carrying a flag in
        ``redo`` (DISTURBED_FLAGS: measured again on what is now, one hopes, a quieter host)."""
        self.data = load_manifest(self.run_dir)  # an older version is migrated, and saved as the current one
        for entry in self.data.points:  # an attempt that did not complete: the next one clears its error
            if entry.status not in ("complete", "pending", None):
                entry.rerun = f"was {entry.status}" + (f": {entry.error}" if entry.error else "")
        self._recheck_complete_points()
        self._redo_flagged(redo)
        self.data.error = None  # the earlier attempt's; this one records its own
        self.data.status = "running"
        self.data.resumed = [*(self.data.resumed or []), time.time()]
        known = {p.point for p in self.data.points}
        for p in points:
            if p.point not in known:
                self.data.points.append(point_entry(p, self.load_mode, self.profile))

    def _recheck_complete_points(self) -> None:
        """A point marked complete whose records are no longer all on disk (a part file deleted or cut short) is
        run again: its remaining rows are moved aside by rundir.supersede before it runs."""
        for entry in self.data.points:
            if entry.status != "complete":
                continue
            want = entry.records.total
            have = count_rows_on_disk(self.run_dir, entry.point)
            if have != want:
                entry.status = "pending"
                entry.rerun = f"{have} of {want} records found on disk"

    def _redo_flagged(self, redo: frozenset[str]) -> None:
        for entry in self.data.points:
            hit = sorted(set(entry.flags) & redo)
            if entry.status == "complete" and hit:
                entry.status = "pending"
                entry.rerun = f"flagged {', '.join(hit)}"
                entry.set_verdict({})  # the new attempt is judged afresh (its run-time flags accumulate from none)

    def finished_on_disk(self, points: list[Point], redo: frozenset[str] = frozenset()) -> bool:
        """A resume with nothing left: the run completed and every point's records are on disk."""
        try:
            m = load_manifest(self.run_dir)
        except (FileNotFoundError, ContractError, OSError):
            return False
        entries = {p.point: p for p in m.points}
        if m.status != "complete" or any(p.point not in entries for p in points):
            return False
        self.data = m
        return all(
            e.status == "complete"
            and not set(e.flags) & redo
            and count_rows_on_disk(self.run_dir, e.point) == e.records.total
            for e in entries.values()
        )

    # ---------------------------------------------------------------- points
    def entry(self, pid: str) -> PointEntry:
        return self.data.entry(pid)

    def has_point(self, pid: str) -> bool:
        return any(e.point == pid for e in self.data.points)

    def add_point(self, p: Point) -> None:
        self.data.points.append(point_entry(p, self.load_mode, self.profile))

    def update_point(self, pid: str, **fields: Any) -> None:
        """Set fields of a point's entry (each validated: a misspelled name or a wrong type raises)."""
        entry = self.entry(pid)
        for name, value in fields.items():
            setattr(entry, name, value)

    def point_statuses(self) -> list[str]:
        return [str(p.status) for p in self.data.points]

    # ---------------------------------------------------------------- cluster and servers
    def set_cluster(self, section: ClusterInfo) -> None:
        self.data.cluster = section

    def server_config(self, config_id: str) -> ServerConfigEntry:
        return self.data.server_configs[config_id]

    def set_server_config(self, config_id: str, entry: ServerConfigEntry) -> None:
        self.data.server_configs[config_id] = entry

    def update_server_config(self, config_id: str, **fields: Any) -> None:
        entry = self.data.server_configs[config_id]
        for name, value in fields.items():
            setattr(entry, name, value)

    # ---------------------------------------------------------------- a run's end
    def set_error(self, message: str) -> None:
        self.data.error = message

    def close_running_points(self) -> None:
        """Points cut off before their generators reported: count what reached the disk (the generators are dead
        now, so nothing is written after this count)."""
        for p in self.data.points:
            if p.status == "running":
                records = RecordCounts(**rows_by_status(self.run_dir, p.point))
                self.update_point(
                    p.point,
                    status="interrupted",
                    records=records,
                    requests_scheduled=records.total,
                    ended_ts=p.ended_ts or time.time(),
                )
        for cfg in self.data.server_configs.values():
            if cfg.status == "starting":  # stopped while its engine started: it never served a point
                cfg.status = "interrupted"

    def finish(self, status: str, stop_reason: str | None) -> None:
        self.data.status = status
        self.data.stop_reason = stop_reason
        self.data.finished = time.time()
