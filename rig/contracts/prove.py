"""The manifest section of `rig prove` (``Manifest.prove``): its settings, its arms, the schedule it measured, and
the verdict per load band.

An *arm* is one way of choosing the speculative steps: a static setting (``--speculative-num-steps N``, steps 0
included), the *schedule* (the best static steps per load band of this run, handed to the engine as its own
per-batch-size configuration) or the engine's *adaptive* controller. Every arm serves the same requests at the
same levels, so each band compares them request by request.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rig.contracts.search import flag

ArmKind = Literal["static", "schedule", "adaptive"]
BandVerdict = Literal["better", "as good", "worse", "undecided", "not measured"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow")


class ProveSettings(_Record):
    """What `rig prove` measures besides the static settings; stored so a resumed proof repeats itself."""

    adaptive: bool = Field(
        True,
        description="Also measure the engine's own adaptive controller (SGLang --speculative-adaptive, its default "
        "table), not only the schedule.",
        json_schema_extra=flag("--adaptive/--no-adaptive"),
    )
    adaptive_steps: int | None = Field(
        None,
        ge=1,
        le=32,
        description="Startup --speculative-num-steps of the adaptive arm (default: the middle of its table's "
        "candidates, as SGLang picks; SGLang 0.5.17 needs the largest, 7).",
        json_schema_extra=flag("--adaptive-steps"),
    )
    tolerance: float = Field(
        0.02,
        ge=0,
        le=0.5,
        description="Equivalence margin: an arm whose 95 % interval against the best static setting stays above "
        "-tolerance is 'as good' (non-inferior) there.",
        json_schema_extra=flag("--tolerance"),
    )
    from_run: str | None = Field(
        None,
        description="Prove across load changes: run every arm of this earlier rig prove run (its static steps, its "
        "schedule, its adaptive arm) on one point whose load follows --load-profile, judged phase by phase.",
        json_schema_extra=flag("--from"),
    )
    adaptive_config: str | None = Field(
        None,
        description="SGLang adaptive config file (JSON) for the adaptive arm instead of SGLang's default table.",
        json_schema_extra=flag("--adaptive-config", path="existing-file"),
    )


class ScheduleSlot(_Record):
    """One batch-size slot of the schedule: from this running batch up, these steps."""

    batch_size: int  # lower bound, as SGLang's router reads a slot key
    steps: int
    level: float  # the offered load (concurrency or rate) whose band it came from
    running_mean: float | None = None  # the running batch measured there (None: taken as the level)


class ProveArm(_Record):
    label: str
    kind: ArmKind
    server_config: str
    steps: int  # static: its steps; schedule/adaptive: the startup steps
    config_file: str | None = None  # the adaptive config it runs with (relative to the run directory)


class ArmResult(_Record):
    """One arm at one band against the best static setting there (paired when they served the same requests)."""

    value: float | None = None
    margin: float | None = None  # value / best static - 1 (throughput): > 0 is better
    ci_low: float | None = None
    ci_high: float | None = None
    ci_method: str | None = None
    verdict: BandVerdict = "not measured"
    j_per_token: float | None = None
    steps_mean: float | None = None  # active steps, time-weighted over the point (where the server reports them)


class ProveBand(_Record):
    """One load band (a level), or under a load profile one phase (``phase`` and its ``label``) or the whole
    profile (``load_mode`` 'profile')."""

    workload: str
    load_mode: str
    level: float
    phase: int | None = None
    label: str | None = None
    best_static: str | None = None
    best_static_steps: int | None = None
    best_static_value: float | None = None
    best_static_j_per_token: float | None = None
    arms: dict[str, ArmResult] = Field(default_factory=dict)  # by arm label (schedule, adaptive)


class ProveSection(_Record):
    settings: ProveSettings | None = None
    arms: list[ProveArm] = Field(default_factory=list)
    schedule: list[ScheduleSlot] = Field(default_factory=list)
    schedule_note: str | None = None  # how the slots were derived, or why there is no schedule arm
    adaptive_note: str | None = None  # why there is no adaptive arm (vLLM has no controller), when there is none
    objective: str = "throughput"
    bands: list[ProveBand] = Field(default_factory=list)
    profile: str | None = None  # the load profile the arms ran (rig prove --from RUN --load-profile ...)
    phases: list[ProveBand] = Field(default_factory=list)  # per phase (steady state), then the whole profile
    idle_watts: float | None = None  # the energy baseline the J/token figures stand on, where known
    energy_note: str | None = None
    verdict: str | None = None  # one line per arm: as good as the best static everywhere, or where not
