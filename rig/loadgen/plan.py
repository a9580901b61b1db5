"""What the driver hands one generator for one point: its record columns, its sessions, and how to send them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from rig.config import LoadSpec, Timeouts
from rig.contracts import PointColumns
from rig.loadgen.dialects import Dialect
from rig.workloads.base import Session


@dataclass(frozen=True)
class LazySessions:
    """A closed-loop share built on the generator as it goes (duration-bound levels can run for hours).

    Global session i belongs to this generator when (i mod concurrency) mod n_gen == index, as in the eager split.
    Only this generator's own sessions are built, ``chunk`` at a time, synchronously on its event loop: a chunk of
    one blocks the loop for one session's build (greedy ~0.1 ms, realistic ~0.6 ms here), where a chunk of 256
    global sessions blocked it for 20-150 ms, N times as often with N generators (the loop lag of issue 30).
    """

    workload: Any  # WorkloadSpec
    seed: int
    concurrency: int
    n_gen: int
    index: int
    limit: int  # global sessions at most
    chunk: int = 1

    def own_indices(self) -> Iterator[int]:
        """This generator's global session indices, increasing, below ``limit``."""
        residues = [r for r in range(self.concurrency) if r % self.n_gen == self.index]
        if not residues:
            return  # no slot of the level is this generator's (C < G): no session to find among the ten million
        for base in range(0, self.limit, self.concurrency):
            for r in residues:
                if base + r >= self.limit:
                    return
                yield base + r

    def __iter__(self) -> Iterator[Session]:
        from rig.workloads import build_session_indices

        todo = self.own_indices()
        while batch_ids := list(islice(todo, self.chunk)):
            batch = build_session_indices(self.workload, seed=self.seed, indices=batch_ids)
            yield from batch
            if len(batch) < len(batch_ids):
                return  # a dataset without cycle ran out of entries


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
