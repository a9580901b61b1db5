"""A run's points (server configuration x workload x load level x repeat) and their stable ids."""

from __future__ import annotations

from dataclasses import dataclass

from rig.config import RunSpec
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


def point_id(cfg: ServerConfig, workload: WorkloadSpec, concurrency: int | None, rate: float | None,
             mode: str, repeat: int) -> str:
    """Readable and deterministic, so a resumed sweep finds the same points."""
    level = f"c{concurrency}" if rate is None else f"r{rate:g}" + (f"c{concurrency}" if concurrency else "")
    if mode == "trace":
        level = "trace" + (f"c{concurrency}" if concurrency else "")
    rep = f"-rep{repeat}" if repeat else ""
    return f"{cfg.config_id()}-{workload.name}-{level}{rep}"


def expand_points(spec: RunSpec) -> list[Point]:
    points = []
    for cfg in spec.server_configs():
        for wl in spec.workloads:
            for concurrency, rate in spec.load.levels():
                for rep in range(spec.repeat):
                    pid = point_id(cfg, wl, concurrency, rate, spec.load.mode, rep)
                    points.append(Point(pid, cfg, wl, concurrency, rate, rep))
    return points
