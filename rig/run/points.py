"""A run's points (server configuration x workload x load level x repeat) and their stable ids."""

from __future__ import annotations

from dataclasses import dataclass

from rig.config import RunSpec
from rig.contracts import PointIdentity, point_name
from rig.server.spec import ServerConfig
from rig.workloads.spec import WorkloadSpec


@dataclass(frozen=True)
class Point:
    point: str
    server: ServerConfig
    workload: WorkloadSpec
    concurrency: int | None
    rate: float | None
    repeat: int

    @property
    def config_id(self) -> str:
        return self.server.config_id()

    def identity(self, load_mode: str) -> PointIdentity:
        """The point's identity as every package sees it (manifest entry, record columns, analysis)."""
        return PointIdentity(
            point=self.point,
            server_config=self.config_id,
            engine=self.server.engine,
            workload=self.workload.name,
            steps=self.server.steps,
            load_mode=load_mode,
            concurrency=self.concurrency,
            rate=self.rate,
            repeat=self.repeat,
        )


def point_id(
    cfg: ServerConfig, workload: WorkloadSpec, concurrency: int | None, rate: float | None, mode: str, repeat: int
) -> str:
    """Readable and deterministic, so a resumed sweep finds the same points (rig.contracts.point_name)."""
    return point_name(cfg.config_id(), workload.name, concurrency, rate, mode, repeat)


def expand_points(spec: RunSpec) -> list[Point]:
    points = []
    for cfg in spec.server_configs():
        for wl in spec.workloads:
            for concurrency, rate in spec.load.levels():
                for rep in range(spec.repeat):
                    pid = point_id(cfg, wl, concurrency, rate, spec.load.mode, rep)
                    if spec.load.profile:  # one point whose load changes: named apart from a fixed level's point
                        pid = pid.replace(f"-{wl.name}-", f"-{wl.name}-profile-", 1)
                    points.append(Point(pid, cfg, wl, concurrency, rate, rep))
    return points
