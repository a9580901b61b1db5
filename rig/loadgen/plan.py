"""What the driver hands one generator for one point: identity columns, its sessions, and how to send them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from rig.workloads.base import Session


@dataclass(frozen=True)
class PointInfo:
    """Columns shared by every record of a point."""

    run_id: str
    point: str
    engine: str
    workload: str
    api: str
    steps: int
    server_config: str
    server_args: str  # JSON
    load_mode: str
    concurrency: int | None
    rate: float | None
    repeat: int

    def columns(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GeneratorPlan:
    point: PointInfo
    generator: int
    url: str
    model: str
    sessions: tuple[Session, ...]
    arrivals: tuple[float, ...] | None = None  # open loop: due offset of each session from the level start
    slots: int | None = None  # closed loop: this generator's concurrency; open loop: its in-flight cap (or None)
    duration_s: float | None = None
    warmup: tuple[Session, ...] = ()
    connect_s: float = 10.0
    first_token_s: float = 600.0
    total_s: float = 3600.0
    slip_threshold_s: float = 0.010
    extra_headers: dict[str, str] = field(default_factory=dict)  # never logged

    @property
    def n_requests(self) -> int:
        return sum(s.n_requests for s in self.sessions)
