"""What the driver hands one generator for one point: its record columns, its sessions, and how to send them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rig.config import LoadSpec, Timeouts
from rig.contracts import PointColumns
from rig.loadgen.dialects import Dialect
from rig.workloads.base import Session


@dataclass(frozen=True)
class LazySessions:
    """A closed-loop share built on the generator as it goes (duration-bound levels can run for hours).

    Global session i belongs to this generator when (i mod concurrency) mod n_gen == index, as in the eager split.
    """

    workload: Any  # WorkloadSpec
    seed: int
    concurrency: int
    n_gen: int
    index: int
    limit: int  # global sessions at most
    chunk: int = 256

    def __iter__(self) -> Iterator[Session]:
        from rig.workloads import build_session_range

        if self.index >= min(self.concurrency, self.n_gen):
            return  # no slot of the level is this generator's (C < G): no session to find among the ten million
        for start in range(0, self.limit, self.chunk):
            batch = build_session_range(
                self.workload, seed=self.seed, start=start, stop=min(self.limit, start + self.chunk)
            )
            if not batch:
                return
            for offset, session in enumerate(batch):
                if ((start + offset) % self.concurrency) % self.n_gen == self.index:
                    yield session


@dataclass(frozen=True)
class GeneratorPlan:
    point: PointColumns
    generator: int
    url: str
    model: str
    sessions: tuple[Session, ...]
    arrivals: tuple[float, ...] | None = None  # open loop: due offset of each session from the level start
    slots: int | None = None  # closed loop: this generator's concurrency; open loop: its in-flight cap (or None)
    duration_s: float | None = None
    # duration-bound levels: in-flight requests this long past the end are cancelled
    grace_s: float = LoadSpec.model_fields["grace_s"].default
    warmup: tuple[Session, ...] = ()
    timeouts: Timeouts = field(default_factory=Timeouts)
    extra_headers: dict[str, str] = field(default_factory=dict)  # never logged
    lazy: LazySessions | None = None  # closed loop by duration: sessions built on the generator instead
    dialect: Dialect = field(default_factory=Dialect)  # the fields requests may carry (decided by the driver)
    # open loop by duration: the due offset of the first arrival the workload had no session for (a dataset smaller
    # than rate x duration), reported back as the generator's ran_out_s
    supply_ends_s: float | None = None
    # a load profile: each phase's start (seconds from the level's start) and, closed loop, this generator's slots
    # in each phase (``slots`` is their peak); records carry the phase they were due in
    phase_starts: tuple[float, ...] = ()
    phase_slots: tuple[int, ...] = ()

    def session_iter(self) -> Iterator[Session]:
        return iter(self.lazy) if self.lazy is not None else iter(self.sessions)

    @property
    def n_requests(self) -> int | None:
        """Requests planned, or None when the level is bound by its duration (built lazily)."""
        return None if self.lazy is not None else sum(s.n_requests for s in self.sessions)
