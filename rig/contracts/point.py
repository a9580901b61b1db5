"""Point identity: what makes a point the point it is, and the columns every record of it carries."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class PointIdentity(BaseModel):
    """What makes a point the point it is: its configuration, workload and load level (paired across configs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    point: str
    server_config: str
    engine: str
    workload: str
    steps: int
    load_mode: str  # closed | poisson | gamma | trace
    concurrency: int | None
    rate: float | None
    repeat: int


IDENTITY_FIELDS: tuple[str, ...] = tuple(PointIdentity.model_fields)


def point_name(
    config_id: str, workload: str, concurrency: int | None, rate: float | None, mode: str, repeat: int
) -> str:
    """A point's id: readable and deterministic, so a resumed sweep finds the same points."""
    level = f"c{concurrency}" if rate is None else f"r{rate:g}" + (f"c{concurrency}" if concurrency else "")
    if mode == "trace":
        level = "trace" + (f"c{concurrency}" if concurrency else "")
    rep = f"-rep{repeat}" if repeat else ""
    return f"{config_id}-{workload}-{level}{rep}"


class PointColumns(PointIdentity):
    """The columns every record of a point carries: its identity plus the run, the API and the server knobs."""

    run_id: str
    api: str
    server_args: str  # JSON of the point's server knobs, keys sorted

    def columns(self) -> dict[str, Any]:
        return self.model_dump()
